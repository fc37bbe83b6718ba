"""``specserve sim ...``: the simulator kernel's commands: list the built-in scenarios and compare policies on one.

``add_commands`` returns the subcommand group so that another package can add its own commands to it: the lab
(``python -m lab``, outside the installed package) adds the paper campaign's and SpecKV training's commands that way,
so this module never imports the lab. ``python -m specserve.sim ...`` runs the kernel's commands on their own. A
command's result (the scenario list, the comparison table, ``--json``'s one JSON document) goes to stdout; progress
bars, logs and errors go to stderr. Bad scenarios and policy specs exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from typing import TypeVar

from specserve.sim.metrics import summarize
from specserve.sim.oracle import check_policy
from specserve.sim.parallel import DEFAULT_SYNC_S, parallel_refusal
from specserve.sim.runner import simulate
from specserve.sim.scenario import ScenarioError, builtin_scenarios, load_scenario, resolve
from specserve.speculation import EngineTraits, split_specs

DEFAULT_POLICIES = "fixed:k=0,fixed:k=3,adaptive"
# Columns of the compare table, in JSON key order.
COLUMNS = (
    "throughput_tok_s",
    "goodput_tok_s",
    "slo_attainment",
    "mean_e2e_s",
    "p99_e2e_s",
    "mean_ttft_s",
    "mean_tpot_s",
    "acceptance",
    "mean_k",
    "k_switches",
    "wall_s",
)


T = TypeVar("T")


class CommandError(Exception):
    """A user-facing error: printed as one line on stderr, exit status 2."""


def add_commands(parser: argparse.ArgumentParser, dest: str = "sim_command") -> argparse._SubParsersAction:
    """Add the kernel's commands under ``parser``; returns the group, for other packages to add theirs."""
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
        f"so goodput:max_k=4,probe_k=1 is one policy (default: {DEFAULT_POLICIES})",
    )
    compare.add_argument("--seed", type=int, default=0, help="run seed: same seed, same result (default: 0)")
    compare.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes that step the replicas, whole nodes each, synced every --sync-s simulated seconds; open-loop "
        "workloads without a scale-out (default: 1, the whole run in one process)",
    )
    compare.add_argument(
        "--sync-s", type=float, default=DEFAULT_SYNC_S, help=f"with --workers > 1 (default: {DEFAULT_SYNC_S})"
    )
    compare.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    compare.set_defaults(sim_handler=_compare)
    return commands


def run(args: argparse.Namespace) -> int:
    try:
        return args.sim_handler(args)
    except (CommandError, ScenarioError) as exc:
        print(f"specserve sim: {exc}", file=sys.stderr)
        return 2


def split_policies(text: str) -> list[str]:
    """``speculation.split_specs`` for ``--policies``, its errors as CommandError."""
    try:
        return split_specs(text)
    except ValueError as exc:
        raise CommandError(f"--policies: {exc}") from None


def _scenarios(args: argparse.Namespace) -> int:
    rows = []
    for name, path in builtin_scenarios().items():
        rows.append({"name": name, "description": load_scenario(name).description, "file": str(path)})
    if args.json:
        print(json.dumps({"scenarios": rows}, indent=2))
        return 0
    width = max((len(row["name"]) for row in rows), default=0)
    for row in rows:
        print(f"{row['name']:<{width}}  {_shorten(row['description'])}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.scenario)
    resolve(scenario)  # profile and KV errors now, before any run
    problem = parallel_refusal(scenario, args.workers, args.sync_s)
    if problem is not None:
        raise CommandError(f"--workers/--sync-s: {problem}")
    specs = split_policies(args.policies)
    traits = EngineTraits(max_k=scenario.engine.max_k, k0_runs_draft_pass=scenario.engine.k0_runs_draft_pass)
    for spec in specs:
        try:
            check_policy(spec, traits)
        except ValueError as exc:
            raise CommandError(f"bad policy {spec!r}: {exc}") from None
    results = []
    for spec in _progress(specs, scenario.name):
        summary = summarize(simulate(scenario, spec, args.seed, workers=args.workers, sync_s=args.sync_s))
        results.append(
            {
                "policy": spec,
                **{key: summary[key] for key in COLUMNS},
                **{key: value for key, value in summary.items() if key not in COLUMNS and key != "policy"},
            }
        )
    if args.json:
        print(json.dumps({"scenario": scenario.name, "seed": args.seed, "results": results}, indent=2))
    else:
        _print_table(scenario.name, results)
    return 0


def _progress(items: list[T], label: str) -> Iterable[T]:
    """``items`` with a progress bar on stderr where tqdm imports (a runtime dependency); without it, no bar: the
    simulator's own code needs none of it."""
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=label, unit="policy", file=sys.stderr)


def _print_table(name: str, results: list[dict]) -> None:
    header = (
        "POLICY",
        "TOK/S",
        "GOODPUT",
        "SLO ATT",
        "E2E",
        "P99 E2E",
        "TTFT",
        "TPOT",
        "ACCEPT",
        "MEAN K",
        "SWITCHES",
        "WALL",
    )
    table = [header] + [
        (
            r["policy"],
            *(
                f"{r[key]:.3f}" if isinstance(r[key], float) else "-" if r[key] is None else str(r[key])
                for key in COLUMNS
            ),
        )
        for r in results
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    print(f"scenario {name}")
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _shorten(text: str, limit: int = 110) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
