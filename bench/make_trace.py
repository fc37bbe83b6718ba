"""Write a replayable trace (the simulator's format: arrival_s, prompt_tokens, output_tokens): Poisson arrivals
whose rate is constant within each segment, every request the same lengths.

    PYTHONPATH=$PWD .venv/bin/python bench/make_trace.py --segments 1:20,5:10,1:20 \
        --prompt-tokens 32 --output-tokens 64 --seed 0 --out bench/traces/perf-S-low-high-low.csv

``--segments QPS:SECONDS,...`` as ``specserve bench run --rate`` takes them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from lab.experiments.engine_check import TraceRow, write_trace
from specserve.bench.load import parse_rate
from specserve.sim.config import RateSegment
from specserve.sim.workload import poisson_arrivals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--segments", required=True, help="QPS:SECONDS,QPS:SECONDS,...")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    segments = [RateSegment(duration_s=s.duration_s, rate_qps=s.rate_qps) for s in parse_rate(args.segments)]
    arrivals = poisson_arrivals(segments, np.random.default_rng(args.seed))
    rows = [TraceRow(round(float(t), 4), args.prompt_tokens, args.output_tokens) for t in arrivals]
    write_trace(rows, args.out)
    print(f"{args.out}: {len(rows)} requests over {sum(s.duration_s for s in segments):g} s", file=sys.stderr)


if __name__ == "__main__":
    main()
