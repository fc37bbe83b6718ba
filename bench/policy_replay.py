"""Replay a policy's decisions from an engine's step log: what it predicted for every k, beside what the engine
measured, per decode batch size (specserve/experiments/policy_replay.py).

    specserve serve --config CONFIG   # with  step_log: /tmp/steps.jsonl  in CONFIG
    PYTHONPATH=$PWD .venv/bin/python bench/policy_replay.py /tmp/steps.jsonl [--policy adaptive] [--warm-steps 1024]

Every run of consecutive steps under one policy spec on one engine is replayed (``--policy``: only runs whose
spec starts with it). The replayed k agrees with the engine's where the policy learns only from what it observes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specserve.experiments.policy_replay import format_run, replay_run, runs
from specserve.speculation import step_log


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="a step log (JSON lines) an engine wrote")
    parser.add_argument("--policy", default="", help="replay only runs whose policy spec starts with this")
    parser.add_argument("--warm-steps", type=int, default=1024, help="earlier steps a run is warm-started on")
    args = parser.parse_args()
    try:
        steps = step_log.load(args.log)
    except ValueError as exc:
        parser.error(f"log: {exc}")
    selected = runs(steps, args.policy)
    for start, stop in selected:
        print(format_run(replay_run(steps, start, stop, args.warm_steps)), end="\n\n")
    if not selected:
        print(f"no run of a policy starting with {args.policy!r} in {args.log}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
