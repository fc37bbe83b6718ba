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

Most of what the engine adds is the forward pass between a step's choose and its observe: it pushes the policy's
code and data out of the CPU's caches, and each call then costs several times its warm time (on the tiny pair
served at 4 clients, 47 us a step replayed, 190 us in the engine). ``--forward-mib N`` reads an N MiB buffer
there, a forward's stand-in; 128 MiB brings the replay to the engine's figure on this machine (32 MiB, its L3,
halfway: 131 us).
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

import numpy as np

from lab.experiments.policy_replay import load_log_arg, runs, warm_policy


def timed_replay(
    steps, start: int, stop: int, profiler: cProfile.Profile | None = None, forward: np.ndarray | None = None
) -> float:
    """Seconds in choose + observe over ``steps[start:stop]``, from a policy warm-started on the engine's earlier
    steps (at most 1024, as the engine's ``set_policy`` does). With ``forward``, a buffer read between each choose
    and its observe, where the engine runs the step's forward pass."""
    policy = warm_policy(steps, start)
    spent = 0.0
    for logged in steps[start:stop]:
        if profiler is not None:
            profiler.enable()
        began = time.perf_counter()
        policy.choose(logged.ctx)
        spent += time.perf_counter() - began
        if forward is not None:
            forward.sum()
        began = time.perf_counter()
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
    parser.add_argument(
        "--forward-mib", type=float, default=0.0, help="read this many MiB between choose and observe (above)"
    )
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats: {args.repeats} is not a positive count")
    if not args.forward_mib >= 0:
        parser.error(f"--forward-mib: {args.forward_mib} is not a size in MiB")
    forward = np.ones(int(args.forward_mib * 2**20) // 8) if args.forward_mib else None
    steps = load_log_arg(parser, args.log)
    selected = runs(steps, args.policy)
    for start, stop in selected:
        seconds = statistics.median(timed_replay(steps, start, stop, forward=forward) for _ in range(args.repeats))
        row: dict[str, object] = {
            "policy": steps[start].policy,
            "engine": steps[start].engine,
            "steps": stop - start,
            "forward_mib": args.forward_mib,
            "policy_us_per_step": round(1e6 * seconds / (stop - start), 1),
        }
        if args.profile:
            profiler = cProfile.Profile()
            timed_replay(steps, start, stop, profiler, forward)
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
