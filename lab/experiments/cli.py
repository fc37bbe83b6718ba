"""``python -m lab reproduce|leaderboard|latency-check|gpu-fit``: the paper campaign's commands beside the kernel's.

``add_commands`` adds the kernel's commands (``specserve.sim.cli``) and then the campaign's to the same group, and
``run`` is the kernel's (one error line on stderr, exit status 2), so the kernel needs no hook back into the lab.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lab.experiments import latency_check, latency_report, leaderboard, leaderboard_report
from lab.experiments.papers import REPRODUCED
from specserve.sim import cli as kernel_cli
from specserve.sim.cli import CommandError
from specserve.sim.oracle import check_policy
from specserve.sim.scenario import load_scenario
from specserve.speculation import EngineTraits

QUICK_S = 10.0  # arrival window of every scenario under --quick
run = kernel_cli.run


def add_commands(parser: argparse.ArgumentParser, dest: str = "sim_command") -> argparse._SubParsersAction:
    """The kernel's commands and the campaign's under ``parser``; returns the group."""
    commands = kernel_cli.add_commands(parser, dest)
    repro = commands.add_parser("reproduce", help="run each paper's closest scenarios and write reports beside it")
    repro.add_argument(
        "--seed-paper",
        action="append",
        metavar="NAME",
        help=f"one paper (repeatable; default: all of {', '.join(REPRODUCED)})",
    )
    repro.add_argument(
        "--out",
        type=Path,
        default=Path("bench/results"),
        help="folder for <paper>.md and the PNGs (default: bench/results)",
    )
    repro.add_argument("--seed", type=int, default=0, help="run seed (default: 0)")
    repro.add_argument("--quick", action="store_true", help=f"squeeze every scenario's arrivals into {QUICK_S:g} s")
    repro.set_defaults(sim_handler=_reproduce)
    latency = commands.add_parser(
        "latency-check",
        help="price every step time the papers report with the "
        "roofline timer and compare (lab/experiments/papers/step_times.yaml)",
    )
    latency.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    latency.add_argument("--out", type=Path, help="also write latency-check.md and latency-check.png here")
    latency.set_defaults(sim_handler=_latency_check)
    gpu = commands.add_parser(
        "gpu-fit",
        help="fit TurboSpec Eq. 3 to measured GPU forward passes (bench/gpu_forward.py) and report held-out error",
    )
    gpu.add_argument(
        "--measurements", type=Path, nargs="+", required=True, help="JSONL files from bench/gpu_forward.py"
    )
    gpu.add_argument("--out", type=Path, help="write gpu-calibration.md and its PNGs here (e.g. bench/results)")
    gpu.set_defaults(sim_handler=_gpu_fit)
    board = commands.add_parser(
        "leaderboard",
        help="one policy against the whole zoo and the oracle: latency and TPOT at every static rate, throughput "
        "where saturated, SLO goodput, the dynamic scenarios, k switches (the bar adaptive must clear)",
    )
    board.add_argument("--policy", default="adaptive", help="policy spec to test (default: adaptive)")
    board.add_argument(
        "--scenarios", help="comma-separated built-in names or YAML files (default: every built-in one of one replica)"
    )
    board.add_argument("--seed", type=int, default=0, help="first run seed (default: 0)")
    board.add_argument(
        "--seeds", type=int, default=3, help="runs per cell, seeds SEED..SEED+N-1; each cell is their mean (default: 3)"
    )
    board.add_argument("--out", type=Path, help="write <policy>.md and its PNGs here (e.g. bench/results)")
    board.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    board.set_defaults(sim_handler=_leaderboard)
    return commands


def _reproduce(args: argparse.Namespace) -> int:
    # Imported here: it reads the papers' YAML at import, and every `specserve` command builds this parser.
    from lab.experiments.reproduce import reproduce

    papers = args.seed_paper or list(REPRODUCED)
    unknown = [name for name in papers if name not in REPRODUCED]
    if unknown:
        raise CommandError(f"unknown paper {', '.join(map(repr, unknown))}; known: {', '.join(REPRODUCED)}")
    # The reports are this command's result, so their paths go to stdout, one a line.
    for path in reproduce(papers, args.out, args.seed, QUICK_S if args.quick else None):
        print(path)
    return 0


def _gpu_fit(args: argparse.Namespace) -> int:
    from lab.experiments import gpu_fit, gpu_fit_report

    for path in args.measurements:
        if not path.is_file():
            raise CommandError(f"--measurements {str(path)!r}: no such file")
    try:
        fits = gpu_fit.fit_all(gpu_fit.load(args.measurements)[0])
        written = gpu_fit_report.write_report(args.measurements, args.out) if args.out else []
    except (ValueError, KeyError) as exc:
        raise CommandError(f"--measurements: {exc}") from None
    # The fits are the result: pairs.yaml's `linear` entries take these numbers.
    for f in fits:
        print(
            f"{f.hardware} {f.model}: {{s_per_context_token: {f.fit.s_per_context_token:.3g}, "
            f"s_per_batched_token: {f.fit.s_per_batched_token:.3g}, intercept_s: {f.fit.intercept_s:.3g}}}"
            f"  held-out {f.held_out_mape:.1%} mean, {f.held_out_max:.1%} max"
        )
    _log_written([str(p) for p in written])
    return 0


def _leaderboard(args: argparse.Namespace) -> int:
    try:
        check_policy(args.policy, EngineTraits(max_k=8))
    except ValueError as exc:
        raise CommandError(f"--policy {args.policy!r}: {exc}") from None
    names = [name.strip() for name in args.scenarios.split(",")] if args.scenarios else None
    for name in names or []:
        load_scenario(name)  # a bad name or file fails here, before any run
    if args.seeds < 1:
        raise CommandError(f"--seeds {args.seeds}: needs at least 1 run per cell")
    board = leaderboard.evaluate(args.policy, names, range(args.seed, args.seed + args.seeds))
    written = (
        [str(path) for path in leaderboard_report.write_report(board, args.out, _board_command(args))]
        if args.out
        else []
    )
    if args.json:
        print(json.dumps({**_board_json(board), "written": written}, indent=2))
    else:
        p = board.policy
        print(f"{'CELL':45s} {'LOAD':9s} {'MEAN E2E':>8s} {'P99 E2E':>8s} {'TPOT':>6s} {'TOK/S':>6s} {'/ORACLE':>7s}")
        for cell in board.static:
            label = cell.scenario if cell.rate_qps is None else f"{cell.scenario} @ {cell.rate_qps:g} QPS"
            tput = f"{cell.ratio(p):.3f}" if leaderboard.THROUGHPUT in cell.metrics() else "-"
            oracle = cell.oracle_ratio(p)
            print(
                f"{label:45s} {cell.load:9s} {cell.ratio(p, leaderboard.MEAN_E2E):8.3f} "
                f"{cell.ratio(p, leaderboard.P99_E2E):8.3f} {cell.ratio(p, leaderboard.MEAN_TPOT):6.3f} {tput:>6s} "
                f"{'-' if oracle is None else f'{oracle:.3f}':>7s}"
            )
        print(", ".join(f"{name} {ok}" for name, ok in board.verdicts().items()))
        _log_written(written)
    return 0 if board.passed() else 1


def _board_command(args: argparse.Namespace) -> str:
    """The command line that reproduces this leaderboard, naming only the options that differ from the defaults."""
    return (
        "python -m lab leaderboard"
        + (f" --policy {args.policy}" if args.policy != "adaptive" else "")
        + (f" --scenarios {args.scenarios}" if args.scenarios else "")
        + (f" --seed {args.seed}" if args.seed else "")
        + (f" --seeds {args.seeds}" if args.seeds != 3 else "")
        + (f" --out {args.out}" if args.out else "")
    )


def _board_json(board: leaderboard.Leaderboard) -> dict:
    p = board.policy
    return {
        "policy": p,
        "passed": board.passed(),
        "verdicts": board.verdicts(),
        "static": [
            {
                "scenario": c.scenario,
                "rate_qps": c.rate_qps,
                "load": c.load,
                "compared": {
                    m.key: {"value": c.results[p][m.key], "best_rival": c.best_rival(p, m), "ratio": c.ratio(p, m)}
                    for m in c.metrics()
                },
                "oracle_ratio": {m.key: c.oracle_ratio(p, m) for m in (leaderboard.GOODPUT, *leaderboard.LATENCY)},
                "results": c.results,
            }
            for c in board.static
        ],
        "oracle_distances": {
            m.key: board.oracle_distances(m) for m in (leaderboard.GOODPUT, leaderboard.MEAN_E2E, leaderboard.P99_E2E)
        },
        "dynamic_means": board.dynamic_means(),
        "switches": [{"scenario": n, "ours": o, "bandit": b} for n, o, b in board.switches()],
    }


def _latency_check(args: argparse.Namespace) -> int:
    rows = latency_check.check()
    written = [str(path) for path in latency_report.write_report(rows, args.out)] if args.out else []
    if args.json:
        print(json.dumps({**latency_check.as_json(rows), "written": written}, indent=2))
        return 0
    print(f"{'POINT':<42} {'MEASURED':>9} {'PREDICTED':>9} {'RATIO':>6}  (step_s in ms)")
    for row in rows:
        scale = 1e3 if row.point.quantity == latency_check.ABSOLUTE else 1.0
        print(f"{row.point.id:<42} {scale * row.point.measured:>9.3f} {scale * row.predicted:>9.3f} {row.ratio:>6.2f}")
    for absolute, label in ((True, "absolute"), (False, "shape")):
        before, now = latency_check.error_stats(rows, absolute, before=True), latency_check.error_stats(rows, absolute)
        print(
            f"{label}: median |ln ratio| {before.median_log_error:.3f} -> {now.median_log_error:.3f}, "
            f"max {before.max_log_error:.3f} -> {now.max_log_error:.3f} ({now.num_points} points)"
        )
    _log_written(written)
    return 0


def _log_written(paths: list[str]) -> None:
    """Files written beside a table: a log line each on stderr, since the table is the command's result."""
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
