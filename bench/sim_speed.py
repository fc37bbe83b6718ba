"""Simulator speed: a 10-minute simulated trace at 20 QPS must run in at most 10 s of wall time
(the project's speed target).

    .venv/bin/python bench/sim_speed.py [--policies fixed:k=0,fixed:k=3,adaptive] [--seed 0] [--json]

Llama-2-7B + vicuna-160m on one H100 (calibrated linear step times), ShareGPT lengths, Poisson 20 QPS for
600 s: about 12,000 requests and 3 million output tokens. Prints one line per policy (wall seconds, steps,
simulated seconds) to stderr, or one JSON document on stdout with --json.
"""

from __future__ import annotations

import argparse
import json
import sys

from specserve.sim import parse_scenario, simulate, summarize
from specserve.sim.cli import split_policies

SCENARIO = {
    "name": "bench-sim-speed",
    "description": "10 minutes of Poisson 20 QPS ShareGPT on Llama-2-7B + 160m, one H100",
    "hardware": "h100",
    "pair": "llama2-7b+160m",
    "latency": {"kind": "linear"},
    "workload": {"dataset": "sharegpt", "arrivals": {"kind": "poisson", "rate_qps": 20, "duration_s": 600}},
    "acceptance": {"mean": 0.62},
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="fixed:k=0,fixed:k=3,adaptive")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
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
