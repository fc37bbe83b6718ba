"""The policy's own time on an engine's logged steps, outside the engine: the same choose and observe calls on the
same contexts and records, timed in a process that does nothing else.

    PYTHONPATH=$PWD .venv/bin/python lab/studies/policy_cost/policy_cost.py --pair perf --size S --agreement 0.6 \\
        --policies adaptive,fixed:k=2 --step-log /tmp/steps.jsonl
    PYTHONPATH=$PWD .venv/bin/python lab/studies/policy_cost/policy_time_replay.py /tmp/steps.jsonl \
        [--policy adaptive] [--profile 12]

One JSON line per run (one engine, one policy spec): steps, microseconds per step in choose + observe (median over
``--repeats`` replays, each from a fresh policy warm-started as the engine warm-starts one), and with ``--profile N``
the N functions with the most cumulative time under choose and observe. Beside
``lab/studies/policy_cost/policy_cost.py``'s
in-engine figure this tells the policy's own work from what running inside the engine adds.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

from lab.experiments.policy_replay import load_log_arg, runs, warm_policy


def timed_replay(steps, start: int, stop: int, profiler: cProfile.Profile | None = None) -> float:
    """Seconds in choose + observe over ``steps[start:stop]``, from a policy warm-started on the engine's earlier
    steps (at most 1024, as the engine's ``set_policy`` does)."""
    policy = warm_policy(steps, start)
    spent = 0.0
    for logged in steps[start:stop]:
        if profiler is not None:
            profiler.enable()
        began = time.perf_counter()
        policy.choose(logged.ctx)
        policy.observe(logged.record)
        spent += time.perf_counter() - began
        if profiler is not None:
            profiler.disable()
    return spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="a step log (JSON lines) an engine wrote")
    parser.add_argument("--policy", default="", help="only runs whose policy spec starts with this")
    parser.add_argument("--repeats", type=int, default=5, help="replays per run; the median is reported")
    parser.add_argument("--profile", type=int, default=0, help="list this many functions by cumulative time")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats: {args.repeats} is not a positive count")
    steps = load_log_arg(parser, args.log)
    selected = runs(steps, args.policy)
    for start, stop in selected:
        seconds = statistics.median(timed_replay(steps, start, stop) for _ in range(args.repeats))
        row: dict[str, object] = {
            "policy": steps[start].policy,
            "engine": steps[start].engine,
            "steps": stop - start,
            "policy_us_per_step": round(1e6 * seconds / (stop - start), 1),
        }
        if args.profile:
            profiler = cProfile.Profile()
            timed_replay(steps, start, stop, profiler)
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(args.profile)
            row["profile"] = out.getvalue()
        print(json.dumps(row), flush=True)
    if not selected:
        print(f"no run of a policy starting with {args.policy!r} in {args.log}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
