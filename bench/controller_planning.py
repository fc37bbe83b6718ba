"""The controller's own cost per push against the cluster's size, without Ray: the incremental ``ControllerState``
against the planner it replaced (kept as the test oracle, ``tests/unit/controller_per_push.py``), which planned
every live replica at every push.

    .venv/bin/python bench/controller_planning.py [--replicas 100,1000,5000] [--json]

Per replica count: the virtual replicas of `specserve bench controller` (8 a node, 4 deployments, a tenth of the
drafts offloaded) push once each to register, then one timed round; the median of 3 rounds, in microseconds per
push. The old planner's rounds at 5,000 replicas take minutes, so it is timed on a sample of the round's pushes.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

from specserve.cluster.controller_bench import virtual_snapshot
from specserve.controller.state import ControllerState

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "unit"))
from controller_per_push import PerPushControllerState  # noqa: E402

ROUNDS = 3
# Pushes timed per round for the old planner (a sample: its full round is quadratic).
OLD_SAMPLE = 200


def us_per_push(state_cls: type, replicas: int, sample: int | None) -> float:
    rng = random.Random(0)
    snapshots = [virtual_snapshot(i, 8, 4, rng) for i in range(replicas)]
    state = state_cls(time.monotonic)
    for s in snapshots:
        state.push(s)
    timings = []
    for r in range(ROUNDS):
        timed = snapshots if sample is None else random.Random(r).sample(snapshots, min(sample, replicas))
        started = time.perf_counter()
        for s in timed:
            state.push(s)
        timings.append((time.perf_counter() - started) / len(timed) * 1e6)
    return statistics.median(timings)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", default="100,1000,5000")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    for n in (int(x) for x in args.replicas.split(",")):
        new = us_per_push(ControllerState, n, None)
        old = us_per_push(PerPushControllerState, n, OLD_SAMPLE)
        rows.append(
            {"replicas": n, "incremental_us_per_push": round(new, 1), "whole_cluster_us_per_push": round(old, 1)}
        )
        print(
            f"{n:>6} replicas: incremental {new:8.1f} us a push, whole-cluster planning {old:10.1f} us", file=sys.stderr
        )
    if args.json:
        print(json.dumps({"command": "bench/controller_planning.py " + " ".join(sys.argv[1:]), "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
