"""``specserve sim ...``: the simulator kernel's commands: list the built-in scenarios, compare policies on one,
write and train the mlp policy's samples.

``add_commands`` returns the subcommand group so that another package can add its own commands to it: the paper
campaign (``specserve.experiments.cli``) adds ``reproduce``, ``leaderboard`` and ``latency-check`` that way, and the
main command line (``specserve sim``) takes the group from there, so this module never imports the campaign.
``python -m specserve.sim ...`` runs the kernel's commands on their own. A command's result (the scenario list, the
comparison table, ``--json``'s one JSON document) goes to stdout; progress bars, logs and errors go to stderr. Bad
scenarios and policy specs exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm import tqdm

from specserve.sim.metrics import summarize
from specserve.sim.mlp_dump import DEFAULT_MAX_SAMPLES, collect_samples, default_policy, write_samples
from specserve.sim.oracle import check_policy
from specserve.sim.runner import simulate
from specserve.sim.scenario import ScenarioError, builtin_scenarios, load_scenario, resolve
from specserve.speculation import EngineTraits, split_specs
from specserve.speculation.speckv.model import COMPRESSION_CODES, weights_to_json
from specserve.speculation.speckv.training import DEFAULT_EPOCHS, DEFAULT_LEARNING_RATE, mean_squared_error, train_file

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
    compare.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    compare.set_defaults(sim_handler=_compare)
    samples = commands.add_parser("mlp-samples", help="write SpecKV training samples (JSONL) from one scenario run")
    samples.add_argument("--scenario", required=True, help="built-in name (see `sim scenarios`) or YAML file")
    samples.add_argument("--policy", help="policy spec to run (default: cycle over gammas 2-4-6-8 up to max_k)")
    samples.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    samples.add_argument("--seed", type=int, default=0, help="run and subsampling seed (default: 0)")
    samples.add_argument(
        "--compression",
        default="fp16",
        choices=tuple(COMPRESSION_CODES),
        help="the target's quantization, written into every sample (default: fp16)",
    )
    samples.add_argument(
        "--max-samples",
        type=int,
        default=DEFAULT_MAX_SAMPLES,
        help=f"keep a seeded random subset of at most this many (default: {DEFAULT_MAX_SAMPLES})",
    )
    samples.set_defaults(sim_handler=_mlp_samples)
    train = commands.add_parser("train-mlp", help="train the mlp policy's predictor on a samples JSONL file")
    train.add_argument("samples", type=Path, help="JSONL samples, e.g. from `sim mlp-samples`")
    train.add_argument("--out", type=Path, required=True, help="weights JSON to write; use it as mlp:weights=FILE")
    train.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS, help=f"default: {DEFAULT_EPOCHS}")
    train.add_argument(
        "--learning-rate", type=float, default=DEFAULT_LEARNING_RATE, help=f"default: {DEFAULT_LEARNING_RATE:g}"
    )
    train.add_argument("--seed", type=int, default=42, help="initialisation and shuffling seed (default: 42)")
    train.set_defaults(sim_handler=_train_mlp)
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
    specs = split_policies(args.policies)
    traits = EngineTraits(max_k=scenario.engine.max_k, k0_runs_draft_pass=scenario.engine.k0_runs_draft_pass)
    for spec in specs:
        try:
            check_policy(spec, traits)
        except ValueError as exc:
            raise CommandError(f"bad policy {spec!r}: {exc}") from None
    results = []
    for spec in tqdm(specs, desc=scenario.name, unit="policy", file=sys.stderr):
        summary = summarize(simulate(scenario, spec, args.seed))
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


def _mlp_samples(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.scenario)
    resolve(scenario)
    spec = args.policy or default_policy(scenario.engine.max_k)
    traits = EngineTraits(max_k=scenario.engine.max_k, k0_runs_draft_pass=scenario.engine.k0_runs_draft_pass)
    try:
        check_policy(spec, traits)
    except ValueError as exc:
        raise CommandError(f"bad policy {spec!r}: {exc}") from None
    if args.max_samples < 1:
        raise CommandError(f"--max-samples {args.max_samples} must be at least 1")
    if not scenario.acceptance.signals.enabled:
        raise CommandError(f"scenario {scenario.name!r} has acceptance.signals.enabled false: no signals to sample")
    samples, seen = collect_samples(scenario, spec, args.seed, args.compression, args.max_samples)
    if not samples:
        raise CommandError(f"scenario {scenario.name!r} under {spec!r} ran no speculative step: no samples")
    _write(args.out, lambda path: write_samples(path, samples))
    print(
        f"wrote {args.out}: {len(samples)} of {seen} samples ({scenario.name}, {spec}, seed {args.seed})",
        file=sys.stderr,
    )
    return 0


def _train_mlp(args: argparse.Namespace) -> int:
    if not args.samples.is_file():
        raise CommandError(f"samples file {str(args.samples)!r} not found")
    if args.epochs < 1:
        raise CommandError(f"--epochs {args.epochs} must be at least 1")
    if not args.learning_rate > 0:
        raise CommandError(f"--learning-rate {args.learning_rate} must be positive")
    try:
        weights, samples = train_file(
            args.samples, epochs=args.epochs, learning_rate=args.learning_rate, seed=args.seed
        )
    except ValueError as exc:
        raise CommandError(f"samples file {str(args.samples)!r}: {exc}") from None
    _write(args.out, lambda path: path.write_text(weights_to_json(weights)))
    print(
        f"wrote {args.out}: {len(samples)} samples, training MSE {mean_squared_error(weights, samples):.4f}; "
        f"use it as mlp:weights={args.out}",
        file=sys.stderr,
    )
    return 0


def _write(path: Path, write) -> None:
    try:
        write(path)
    except OSError as exc:
        raise CommandError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None


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
