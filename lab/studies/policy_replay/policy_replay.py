"""Replay a policy's decisions from an engine's step log: what it predicted for every k, beside what the engine
measured, per decode batch size (lab/experiments/policy_replay.py).

    specserve serve --config CONFIG   # with  step_log: /tmp/steps.jsonl  in CONFIG
    PYTHONPATH=$PWD .venv/bin/python lab/studies/policy_replay/policy_replay.py /tmp/steps.jsonl \
        [--policy adaptive] [--warm-steps 1024] \
        [--trace-batch 4 [--trace-every 60]]

Every run of consecutive steps under one policy spec on one engine is replayed (``--policy``: only runs whose
spec starts with it). The replayed k agrees with the engine's where the policy learns only from what it observes.
``--trace-batch B`` adds, for ``adaptive``, how it priced each k at B requests as the run went on: its step-cost
fit, its bucket correction and its acceptance estimate, the parts a mispriced k is traced back to.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lab.experiments.policy_replay import (
    format_prices,
    format_run,
    load_log_arg,
    replay_run,
    runs,
    trace_prices,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="a step log (JSON lines) an engine wrote")
    parser.add_argument("--policy", default="", help="replay only runs whose policy spec starts with this")
    parser.add_argument("--warm-steps", type=int, default=1024, help="earlier steps a run is warm-started on")
    parser.add_argument("--trace-batch", type=int, help="also trace adaptive's prices per k at this batch size")
    parser.add_argument("--trace-every", type=int, default=60, help="every n-th decode step at that batch size")
    args = parser.parse_args()
    if args.trace_batch is not None and args.trace_batch < 1:
        parser.error(f"--trace-batch {args.trace_batch}: must be at least 1")
    if args.trace_every < 1:
        parser.error(f"--trace-every {args.trace_every}: must be at least 1")
    steps = load_log_arg(parser, args.log)
    selected = runs(steps, args.policy)
    for start, stop in selected:
        print(format_run(replay_run(steps, start, stop, args.warm_steps)))
        if args.trace_batch is not None:
            try:
                rows = trace_prices(steps, start, stop, args.trace_batch, args.trace_every, args.warm_steps)
            except ValueError as exc:
                print(f"  no price trace: {exc}")
            else:
                print(format_prices(args.trace_batch, rows))
        print()
    if not selected:
        print(f"no run of a policy starting with {args.policy!r} in {args.log}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
