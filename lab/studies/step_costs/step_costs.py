"""What each k cost an engine and what changing k cost it, from its step log
(lab/experiments/step_costs.py).

    specserve serve --config CONFIG   # with  step_log: /tmp/steps.jsonl  in CONFIG
    PYTHONPATH=$PWD .venv/bin/python lab/studies/step_costs/step_costs.py /tmp/steps.jsonl [--min-steps 20] \
        [--switches-of adaptive]

Prints two Markdown tables: pure decode steps per (batch, k) over every run in the log, and the steps after a
change of k against steady ones, over the runs whose policy spec starts with ``--switches-of``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lab.experiments.policy_replay import load_log_arg
from lab.experiments.step_costs import decode_cells, format_report, switch_excess


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="a step log (JSON lines) an engine wrote")
    parser.add_argument("--min-steps", type=int, default=20, help="report a (batch, k) with at least this many steps")
    parser.add_argument("--switches-of", default="", help="measure switches in runs whose spec starts with this")
    args = parser.parse_args()
    if args.min_steps < 1:
        parser.error(f"--min-steps: {args.min_steps} must be at least 1")
    steps = load_log_arg(parser, args.log)
    cells = decode_cells(steps, min_steps=args.min_steps)
    if not cells:
        print(f"no (batch, k) with {args.min_steps} pure decode steps in {args.log}", file=sys.stderr)
        return 1
    print(format_report(cells, switch_excess(steps, args.switches_of)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
