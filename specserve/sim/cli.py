"""``specserve sim ...``: list the built-in scenarios, compare policies on one, reproduce the papers' tables.

The lead wires it into the main command line as

    sim = commands.add_parser("sim", help="discrete-event simulator")
    add_commands(sim, dest="sim_command")
    sim.set_defaults(run=specserve.sim.cli.run)

and ``python -m specserve.sim ...`` runs the same commands on their own. ``--json`` prints one JSON document on
stdout; tables, progress bars and errors go to stderr. Bad scenarios and policy specs exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm import tqdm

from specserve.sim.metrics import summarize
from specserve.sim.reproduce import PAPERS, reproduce
from specserve.sim.runner import simulate
from specserve.sim.scenario import ScenarioError, builtin_scenarios, load_scenario, resolve
from specserve.speculation import EngineTraits, make_policy

DEFAULT_POLICIES = "fixed:k=0,fixed:k=3,adaptive"
# Columns of the compare table, in JSON key order.
COLUMNS = ("throughput_tok_s", "goodput_tok_s", "mean_e2e_s", "p99_e2e_s", "mean_ttft_s", "mean_tpot_s",
           "acceptance", "mean_k", "k_switches", "wall_s")


QUICK_S = 10.0  # arrival window of every scenario under --quick


class CommandError(Exception):
    """A user-facing error: printed as one line on stderr, exit status 2."""


def add_commands(parser: argparse.ArgumentParser, dest: str = "sim_command") -> None:
    commands = parser.add_subparsers(dest=dest, required=True)
    scenarios = commands.add_parser("scenarios", help="list the built-in scenarios")
    scenarios.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    scenarios.set_defaults(sim_handler=_scenarios)
    compare = commands.add_parser("compare", help="run one scenario under several policies")
    compare.add_argument("--scenario", required=True, help="built-in name (see `sim scenarios`) or YAML file")
    compare.add_argument(
        "--policies",
        default=DEFAULT_POLICIES,
        help="policy specs separated by commas; a comma followed by key=value continues the previous spec, "
        f"so goodput:k_max=4,probe_k=1 is one policy (default: {DEFAULT_POLICIES})",
    )
    compare.add_argument("--seed", type=int, default=0, help="run seed: same seed, same result (default: 0)")
    compare.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    compare.set_defaults(sim_handler=_compare)
    repro = commands.add_parser("reproduce", help="run each paper's closest scenarios and write reports beside it")
    repro.add_argument("--seed-paper", action="append", metavar="NAME",
                       help=f"one paper (repeatable; default: all of {', '.join(PAPERS)})")
    repro.add_argument("--out", type=Path, default=Path("bench/results"),
                       help="folder for <paper>.md and the PNGs (default: bench/results)")
    repro.add_argument("--seed", type=int, default=0, help="run seed (default: 0)")
    repro.add_argument("--quick", action="store_true", help=f"squeeze every scenario's arrivals into {QUICK_S:g} s")
    repro.set_defaults(sim_handler=_reproduce)


def run(args: argparse.Namespace) -> int:
    try:
        return args.sim_handler(args)
    except (CommandError, ScenarioError) as exc:
        print(f"specserve sim: {exc}", file=sys.stderr)
        return 2


def split_policies(text: str) -> list[str]:
    """Split a --policies list on the commas that start a new policy.

    A comma-separated piece with '=' but no ':' (``probe_k=1``) is another parameter of the spec before it:
    ``fixed:k=0,goodput:k_max=4,probe_k=1,adaptive`` -> ``fixed:k=0``, ``goodput:k_max=4,probe_k=1``, ``adaptive``.
    """
    specs: list[str] = []
    for piece in (part.strip() for part in text.split(",")):
        if not piece:
            raise CommandError(f"empty policy in --policies {text!r}")
        if "=" in piece and ":" not in piece:
            if not specs:
                raise CommandError(f"policy parameter {piece!r} in --policies {text!r} has no policy before it")
            specs[-1] = f"{specs[-1]},{piece}"
        else:
            specs.append(piece)
    return specs


def _scenarios(args: argparse.Namespace) -> int:
    rows = []
    for name, path in builtin_scenarios().items():
        rows.append({"name": name, "description": load_scenario(name).description, "file": str(path)})
    if args.json:
        print(json.dumps({"scenarios": rows}, indent=2))
        return 0
    width = max((len(row["name"]) for row in rows), default=0)
    for row in rows:
        print(f"{row['name']:<{width}}  {_shorten(row['description'])}", file=sys.stderr)
    return 0


def _compare(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.scenario)
    resolve(scenario)  # profile and KV errors now, before any run
    specs = split_policies(args.policies)
    traits = EngineTraits(max_k=scenario.engine.max_k, k0_runs_draft_pass=scenario.engine.k0_runs_draft_pass)
    for spec in specs:
        try:
            make_policy(spec, traits)
        except ValueError as exc:
            raise CommandError(f"bad policy {spec!r}: {exc}") from None
    results = []
    for spec in tqdm(specs, desc=scenario.name, unit="policy", file=sys.stderr):
        summary = summarize(simulate(scenario, spec, args.seed))
        results.append({"policy": spec, **{key: summary[key] for key in COLUMNS},
                        **{key: value for key, value in summary.items() if key not in COLUMNS and key != "policy"}})
    if args.json:
        print(json.dumps({"scenario": scenario.name, "seed": args.seed, "results": results}, indent=2))
    else:
        _print_table(scenario.name, results)
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    papers = args.seed_paper or list(PAPERS)
    unknown = [name for name in papers if name not in PAPERS]
    if unknown:
        raise CommandError(f"unknown paper {', '.join(map(repr, unknown))}; known: {', '.join(PAPERS)}")
    for path in reproduce(papers, args.out, args.seed, QUICK_S if args.quick else None):
        print(path)
    return 0


def _print_table(name: str, results: list[dict]) -> None:
    header = ("POLICY", "TOK/S", "GOODPUT", "E2E", "P99 E2E", "TTFT", "TPOT", "ACCEPT", "MEAN K", "SWITCHES", "WALL")
    table = [header] + [
        (r["policy"], *(f"{r[key]:.3f}" if isinstance(r[key], float) else str(r[key]) for key in COLUMNS))
        for r in results
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    print(f"scenario {name}", file=sys.stderr)
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip(), file=sys.stderr)


def _shorten(text: str, limit: int = 110) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
