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

from specserve.sim import latency_check, latency_report, leaderboard, leaderboard_report
from specserve.sim.metrics import summarize
from specserve.sim.mlp_dump import DEFAULT_MAX_SAMPLES, collect_samples, default_policy, write_samples
from specserve.sim.reproduce import PAPERS, reproduce
from specserve.sim.runner import simulate
from specserve.sim.scenario import ScenarioError, builtin_scenarios, load_scenario, resolve
from specserve.speculation import EngineTraits, make_policy
from specserve.speculation.speckv.model import COMPRESSION_CODES, weights_to_json
from specserve.speculation.speckv.training import DEFAULT_EPOCHS, DEFAULT_LEARNING_RATE, mean_squared_error, train_file

DEFAULT_POLICIES = "fixed:k=0,fixed:k=3,adaptive"
# Columns of the compare table, in JSON key order.
COLUMNS = ("throughput_tok_s", "goodput_tok_s", "slo_attainment", "mean_e2e_s", "p99_e2e_s", "mean_ttft_s",
           "mean_tpot_s", "acceptance", "mean_k", "k_switches", "wall_s")


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
    latency = commands.add_parser("latency-check", help="price every step time the papers report with the "
                                  "roofline timer and compare (profiles/paper_step_times.yaml)")
    latency.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    latency.add_argument("--out", type=Path, help="also write latency-check.md and latency-check.png here")
    latency.set_defaults(sim_handler=_latency_check)
    samples = commands.add_parser("mlp-samples", help="write SpecKV training samples (JSONL) from one scenario run")
    samples.add_argument("--scenario", required=True, help="built-in name (see `sim scenarios`) or YAML file")
    samples.add_argument("--policy", help="policy spec to run (default: cycle over gammas 2-4-6-8 up to max_k)")
    samples.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    samples.add_argument("--seed", type=int, default=0, help="run and subsampling seed (default: 0)")
    samples.add_argument("--compression", default="fp16", choices=tuple(COMPRESSION_CODES),
                         help="the target's quantization, written into every sample (default: fp16)")
    samples.add_argument("--max-samples", type=int, default=DEFAULT_MAX_SAMPLES,
                         help=f"keep a seeded random subset of at most this many (default: {DEFAULT_MAX_SAMPLES})")
    samples.set_defaults(sim_handler=_mlp_samples)
    train = commands.add_parser("train-mlp", help="train the mlp policy's predictor on a samples JSONL file")
    train.add_argument("samples", type=Path, help="JSONL samples, e.g. from `sim mlp-samples`")
    train.add_argument("--out", type=Path, required=True, help="weights JSON to write; use it as mlp:weights=FILE")
    train.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS, help=f"default: {DEFAULT_EPOCHS}")
    train.add_argument("--learning-rate", type=float, default=DEFAULT_LEARNING_RATE,
                       help=f"default: {DEFAULT_LEARNING_RATE:g}")
    train.add_argument("--seed", type=int, default=42, help="initialisation and shuffling seed (default: 42)")
    train.set_defaults(sim_handler=_train_mlp)
    board = commands.add_parser("leaderboard", help="one policy against the whole zoo: every static rate, the dynamic "
                                "scenarios, k switches (the bar adaptive must clear)")
    board.add_argument("--policy", default="adaptive", help="policy spec to test (default: adaptive)")
    board.add_argument("--scenarios", help="comma-separated built-in names or YAML files (default: all built-in)")
    board.add_argument("--seed", type=int, default=0, help="first run seed (default: 0)")
    board.add_argument("--seeds", type=int, default=3,
                       help="runs per cell, seeds SEED..SEED+N-1; each cell is their mean (default: 3)")
    board.add_argument("--out", type=Path, help="write <policy>.md and its PNGs here (e.g. bench/results)")
    board.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    board.set_defaults(sim_handler=_leaderboard)


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


def _leaderboard(args: argparse.Namespace) -> int:
    try:
        make_policy(args.policy, EngineTraits(max_k=8))
    except ValueError as exc:
        raise CommandError(f"--policy {args.policy!r}: {exc}") from None
    names = [name.strip() for name in args.scenarios.split(",")] if args.scenarios else None
    for name in names or []:
        load_scenario(name)  # a bad name or file fails here, before any run
    if args.seeds < 1:
        raise CommandError(f"--seeds {args.seeds}: needs at least 1 run per cell")
    board = leaderboard.evaluate(args.policy, names, range(args.seed, args.seed + args.seeds))
    command = "specserve sim leaderboard" + (f" --policy {args.policy}" if args.policy != "adaptive" else "") + (
        f" --scenarios {args.scenarios}" if args.scenarios else "") + (
        f" --seed {args.seed}" if args.seed else "") + (f" --seeds {args.seeds}" if args.seeds != 3 else "") + (
        f" --out {args.out}" if args.out else "")
    written = [str(path) for path in leaderboard_report.write_report(board, args.out, command)] if args.out else []
    if args.json:
        print(json.dumps({"policy": board.policy, "passed": board.passed(), "static_pass": board.static_pass(),
                          "dynamic_pass": board.dynamic_pass(), "switches_pass": board.switches_pass(),
                          "static": [{"scenario": c.scenario, "rate_qps": c.rate_qps, "best_rival": c.best_rival(board.policy),
                                      "ratio": c.ratio(board.policy)} for c in board.static],
                          "dynamic_means": board.dynamic_means(),
                          "switches": [{"scenario": n, "ours": o, "bandit": b} for n, o, b in board.switches()],
                          "written": written}, indent=2))
    else:
        for cell in board.static:
            label = cell.scenario if cell.rate_qps is None else f"{cell.scenario} @ {cell.rate_qps:g} QPS"
            print(f"{label:45s} {cell.ratio(board.policy):.3f} x {cell.best_rival(board.policy)}", file=sys.stderr)
        print(f"static {board.static_pass()}, dynamic {board.dynamic_pass()}, switches {board.switches_pass()}",
              file=sys.stderr)
        for path in written:
            print(path)
    return 0 if board.passed() else 1


def _mlp_samples(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.scenario)
    resolve(scenario)
    spec = args.policy or default_policy(scenario.engine.max_k)
    traits = EngineTraits(max_k=scenario.engine.max_k, k0_runs_draft_pass=scenario.engine.k0_runs_draft_pass)
    try:
        make_policy(spec, traits)
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
    print(f"wrote {args.out}: {len(samples)} of {seen} samples ({scenario.name}, {spec}, seed {args.seed})",
          file=sys.stderr)
    return 0


def _train_mlp(args: argparse.Namespace) -> int:
    if not args.samples.is_file():
        raise CommandError(f"samples file {str(args.samples)!r} not found")
    if args.epochs < 1:
        raise CommandError(f"--epochs {args.epochs} must be at least 1")
    if not args.learning_rate > 0:
        raise CommandError(f"--learning-rate {args.learning_rate} must be positive")
    try:
        weights, samples = train_file(args.samples, epochs=args.epochs, learning_rate=args.learning_rate,
                                      seed=args.seed)
    except ValueError as exc:
        raise CommandError(f"samples file {str(args.samples)!r}: {exc}") from None
    _write(args.out, lambda path: path.write_text(weights_to_json(weights)))
    print(f"wrote {args.out}: {len(samples)} samples, training MSE {mean_squared_error(weights, samples):.4f}; "
          f"use it as mlp:weights={args.out}", file=sys.stderr)
    return 0


def _write(path: Path, write) -> None:
    try:
        write(path)
    except OSError as exc:
        raise CommandError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None


def _latency_check(args: argparse.Namespace) -> int:
    rows = latency_check.check()
    written = [str(path) for path in latency_report.write_report(rows, args.out)] if args.out else []
    if args.json:
        print(json.dumps({**latency_check.as_json(rows), "written": written}, indent=2))
        return 0
    print(f"{'POINT':<42} {'MEASURED':>9} {'PREDICTED':>9} {'RATIO':>6}  (step_s in ms)", file=sys.stderr)
    for row in rows:
        scale = 1e3 if row.point.quantity == latency_check.ABSOLUTE else 1.0
        print(f"{row.point.id:<42} {scale * row.point.measured:>9.3f} {scale * row.predicted:>9.3f} "
              f"{row.ratio:>6.2f}", file=sys.stderr)
    for absolute, label in ((True, "absolute"), (False, "shape")):
        before, now = latency_check.error_stats(rows, absolute, before=True), latency_check.error_stats(rows, absolute)
        print(f"{label}: median |ln ratio| {before.median_log_error:.3f} -> {now.median_log_error:.3f}, "
              f"max {before.max_log_error:.3f} -> {now.max_log_error:.3f} ({now.num_points} points)", file=sys.stderr)
    for path in written:
        print(path)
    return 0


def _print_table(name: str, results: list[dict]) -> None:
    header = ("POLICY", "TOK/S", "GOODPUT", "SLO ATT", "E2E", "P99 E2E", "TTFT", "TPOT", "ACCEPT", "MEAN K", "SWITCHES",
              "WALL")
    table = [header] + [
        (r["policy"], *(f"{r[key]:.3f}" if isinstance(r[key], float) else "-" if r[key] is None else str(r[key])
                        for key in COLUMNS))
        for r in results
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    print(f"scenario {name}", file=sys.stderr)
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip(), file=sys.stderr)


def _shorten(text: str, limit: int = 110) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
