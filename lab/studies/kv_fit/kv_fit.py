"""What ``adaptive``'s KV fit buys where the pool runs out: ``adaptive`` against ``adaptive:kv_fit=false`` in
saturated simulator cells, each a scenario held at one rate as the leaderboard's static cells are (60 s of Poisson
arrivals), over several seeds. Prints one line per cell and policy (means over seeds: mean and p99 E2E, mean
TTFT, throughput, mean k, preemptions) and writes them to ``--out`` as JSON.

    PYTHONPATH=$PWD .venv/bin/python lab/studies/kv_fit/kv_fit.py [--seeds 6] [--out bench/results/kv_fit.json]

Kept as the record of the study that settled the rule: the fit is now the only code path of ``adaptive`` and
``kv_fit`` is no longer a parameter (issue 60), so ``adaptive:kv_fit=false`` is refused with an error naming it and
the script no longer runs as written. Its results are bench/results/kv_fit.json, summarised in
docs/policies/adaptive.md ("How we got here").
"""

from __future__ import annotations

import argparse
import json
import statistics
from concurrent.futures import ProcessPoolExecutor

from lab.experiments.leaderboard import at_static_rate
from specserve.sim import simulate, summarize
from specserve.sim.scenario import load_scenario

# The saturated cells where the leaderboard found adaptive weakest before the fit, and a tuning scenario's.
CELLS = (
    ("bench/scenarios/tune/4090x2-7b-replicas.yaml", 24.0),
    ("nightjar-4090-7b-dynamic", 16.0),
    ("nightjar-l20x2-32b-dynamic", 6.0),
)
POLICIES = ("adaptive", "adaptive:kv_fit=false")
KEYS = ("mean_e2e_s", "p99_e2e_s", "mean_ttft_s", "throughput_tok_s", "mean_k", "num_preemptions")


def run(job: tuple[str, float, str, int]) -> dict:
    scenario, rate, policy, seed = job
    return summarize(simulate(at_static_rate(load_scenario(scenario), rate, 60.0), policy, seed))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--out", default="bench/results/kv_fit.json")
    args = parser.parse_args()
    jobs = [
        (scenario, rate, policy, seed) for scenario, rate in CELLS for policy in POLICIES for seed in range(args.seeds)
    ]
    with ProcessPoolExecutor(2) as pool:
        summaries = list(pool.map(run, jobs))
    rows = []
    for scenario, rate in CELLS:
        for policy in POLICIES:
            runs = [
                s for (sc, r, p, _), s in zip(jobs, summaries, strict=True) if (sc, r, p) == (scenario, rate, policy)
            ]
            row = {"scenario": scenario, "rate_qps": rate, "policy": policy, "seeds": args.seeds}
            row |= {key: statistics.mean(s[key] for s in runs) for key in KEYS}
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump({"command": f"lab/studies/kv_fit/kv_fit.py --seeds {args.seeds}", "cells": rows}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
