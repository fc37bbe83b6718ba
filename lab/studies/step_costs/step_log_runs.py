"""Each run of a step log (consecutive steps under one policy spec), summarised: its steps, tokens and switches, its
decode steps at each k (mean duration, tokens per request, the target's and the draft's parts), and with
``--sequence`` the k it ran as runs of equal k with their start times, and with ``--phases`` each phase of a
``bench compare --clients`` schedule apart (seconds from the run's first step). The where-did-it-go view of a served
comparison run with ``step_log:`` in its config
(``lab/studies/policy_replay/policy_replay.py`` replays the policy's prices instead).

    PYTHONPATH=$PWD .venv/bin/python lab/studies/step_costs/step_log_runs.py /tmp/steps.jsonl \\
        [--policy P] [--batch 1] [--sequence] \\
        [--phases 30,30,30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from itertools import groupby, pairwise
from pathlib import Path

from lab.experiments.policy_replay import load_log_arg, runs


def summary(steps, start: int, stop: int, batch: int) -> str:
    records = [s.record for s in steps[start:stop]]
    busy_s = sum(r.duration_s for r in records)
    tokens = sum(r.num_emitted_tokens for r in records)
    switches = sum(a.k != b.k for a, b in pairwise(records))
    by_k = defaultdict(list)
    for r in records:  # decode-only steps of the batch size asked for
        if r.num_running == batch and r.num_batched_tokens == r.num_running + r.num_drafted:
            by_k[r.k].append(r)
    parts = " ".join(
        f"k{k}:{len(rs)} {1e3 * statistics.mean(r.duration_s for r in rs):.1f}ms "
        f"{statistics.mean(r.num_emitted_tokens for r in rs) / batch:.2f}t "
        f"(target {1e3 * statistics.mean(r.forward_s or 0.0 for r in rs):.1f}, "
        f"draft {1e3 * statistics.mean(r.draft_s or 0.0 for r in rs):.1f})"
        for k, rs in sorted(by_k.items())
    )
    return (
        f"{steps[start].policy}: {stop - start} steps, {tokens} tokens, {tokens / max(busy_s, 1e-9):.1f} tok/s of "
        f"step time, {switches} switches | batch {batch}: {parts}"
    )


def sequence(steps, start: int, stop: int) -> str:
    t0 = steps[start].record.now_s
    out, i = [], start
    for k, group in groupby(steps[start:stop], key=lambda s: s.record.k):
        n = len(list(group))
        out.append(f"{k}x{n}@{steps[i].record.now_s - t0:.1f}s")
        i += n
    return "  k x steps @ start: " + " ".join(out)


def phases(steps, start: int, stop: int, lengths: list[float]) -> str:
    """Each phase's tokens, steps, mean k, mean batch and mean step time: where a schedule's run gained or lost."""
    t0 = steps[start].record.now_s
    out, end = [], 0.0
    for length in lengths:
        begin, end = end, end + length
        rs = [s.record for s in steps[start:stop] if begin <= s.record.now_s - t0 < end]
        if not rs:
            out.append(f"{begin:g}-{end:g}s -")
            continue
        out.append(
            f"{begin:g}-{end:g}s {sum(r.num_emitted_tokens for r in rs)}t {len(rs)}st "
            f"k{statistics.mean(r.k for r in rs):.2f} b{statistics.mean(r.num_running for r in rs):.1f} "
            f"{1e3 * statistics.mean(r.duration_s for r in rs):.0f}ms"
        )
    return "  phases: " + " | ".join(out)


def phase_lengths(parser: argparse.ArgumentParser, text: str) -> list[float]:
    try:
        lengths = [float(x) for x in text.split(",")]
    except ValueError:
        parser.error(f"--phases {text!r}: want seconds, comma-separated, e.g. 30,30,30")
    if not lengths or any(x <= 0 for x in lengths):
        parser.error(f"--phases {text!r}: every phase must last more than 0 s")
    return lengths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="a step log (JSON lines) an engine wrote")
    parser.add_argument("--policy", default="", help="only runs whose policy spec starts with this")
    parser.add_argument("--batch", type=int, default=1, help="the decode batch size whose steps are broken down")
    parser.add_argument("--sequence", action="store_true", help="also print each run's k as runs of equal k")
    parser.add_argument("--phases", default="", help="also split each run into phases of these seconds: 30,30,30")
    args = parser.parse_args()
    if args.batch < 1:
        parser.error(f"--batch {args.batch}: must be at least 1")
    lengths = phase_lengths(parser, args.phases) if args.phases else []
    steps = load_log_arg(parser, args.log)
    for start, stop in runs(steps, args.policy):
        print(summary(steps, start, stop, args.batch))
        if args.sequence:
            print(sequence(steps, start, stop))
        if lengths:
            print(phases(steps, start, stop, lengths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
