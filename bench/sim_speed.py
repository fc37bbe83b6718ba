"""Simulator speed: a 10-minute simulated trace at 20 QPS must run in at most 10 s of wall time
(the project's speed target).

    .venv/bin/python bench/sim_speed.py [--policies fixed:k=0,fixed:k=3,adaptive] [--seed 0] [--json]
    .venv/bin/python bench/sim_speed.py --cluster 8:60 [--rounds 3] [--seed 0]

Llama-2-7B + vicuna-160m on one H100 (calibrated linear step times), ShareGPT lengths, Poisson 20 QPS for
600 s: about 12,000 requests and 3 million output tokens. Prints one line per policy (wall seconds, steps,
simulated seconds) to stderr, or one JSON document on stdout with --json.

``--cluster REPLICAS:SECONDS`` times the per-step cost instead (issue 62): ``adaptive`` on a slice of
cluster-4090-7b-64x-hour.yaml (sim.cluster_slice), ``--rounds`` times, one line per round with wall and CPU
microseconds per simulated step. To compare two trees, run it with each on PYTHONPATH (an older tree:
``git archive <commit> specserve | tar -x -C /tmp/old``), interleaving the rounds on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from specserve.sim import load_scenario, parse_scenario, simulate, summarize
from specserve.sim.cli import split_policies
from specserve.sim.cluster_slice import cluster_slice

CLUSTER = Path(__file__).resolve().parents[1] / "specserve/sim/scenarios/cluster-4090-7b-64x-hour.yaml"

SCENARIO = {
    "name": "bench-sim-speed",
    "description": "10 minutes of Poisson 20 QPS ShareGPT on Llama-2-7B + 160m, one H100",
    "hardware": "h100",
    "pair": "llama2-7b+160m",
    "latency": {"kind": "linear"},
    "workload": {"dataset": "sharegpt", "arrivals": {"kind": "poisson", "rate_qps": 20, "duration_s": 600}},
    "acceptance": {"mean": 0.62},
}


def time_cluster(replicas_seconds: str, rounds: int, seed: int) -> None:
    """Per-step cost of ``adaptive`` on a slice of the 64-replica hour, one line per round."""
    replicas, seconds = replicas_seconds.split(":")
    scenario = cluster_slice(load_scenario(CLUSTER), int(replicas), float(seconds))
    for _ in range(rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        steps = summarize(simulate(scenario, "adaptive", seed))["num_steps"]
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(
            f"{replicas} x {seconds} s: {steps} steps  wall {wall:6.2f} s  {1e6 * wall / steps:5.0f} us/step  "
            f"cpu {1e6 * cpu / steps:5.0f} us/step",
            file=sys.stderr,
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="fixed:k=0,fixed:k=3,adaptive")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--cluster", metavar="REPLICAS:SECONDS", help="time adaptive's per-step cost on a slice")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.cluster:
        time_cluster(args.cluster, args.rounds, args.seed)
        return 0
    scenario = parse_scenario(SCENARIO)
    rows = []
    for spec in split_policies(args.policies):
        summary = summarize(simulate(scenario, spec, args.seed))
        rows.append(summary)
        print(
            f"{spec:<14} wall {summary['wall_s']:6.2f} s  steps {summary['num_steps']:7d}  "
            f"simulated {summary['run_s']:7.1f} s  requests {summary['num_requests']}  "
            f"throughput {summary['throughput_tok_s']:8.1f} tok/s",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps({"scenario": SCENARIO["name"], "results": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
