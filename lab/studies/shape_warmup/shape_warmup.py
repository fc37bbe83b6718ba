"""What the first decode step at a new (batch, k) costs on a CPU engine, with and without specserve's decode-shape
warm-up (specserve/replicas/worker/shape_warmup.py).

    PYTHONPATH=$PWD .venv/bin/python lab/studies/shape_warmup/shape_warmup.py [--rounds 3] [--out FILE]
        [--pair trained | --pair perf --size S --agreement 0.6]

One engine at a time (warm-up off, then on, each started afresh), 8 seats, max_k 4. Each round runs every batch
1-8 at every fixed k = 0-4 (40 shapes): greedy generation of 12 tokens for B prompts. For each shape, the
excess of its first decode step at B x (k + 1) rows over the median of the shape's later steps. Round 0 is
the shapes' first meeting with the engine; later rounds meet them again. Prints one JSON document: per
setting and round, the median, mean and max excess in ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from typing import Any

from lab.experiments.report_io import emit_report
from specserve.models.arguments import add_perf_options
from specserve.models.prompts import OPENINGS

BATCHES = range(1, 9)
KS = range(0, 5)
MAX_TOKENS = 12


def run(target: str, draft: str, rounds: int) -> list[dict[str, float]]:
    from vllm import SamplingParams

    from specserve.replicas.config import engine_env
    from specserve.replicas.config.engine_args import EngineSpec, speculative_engine_kwargs
    from specserve.replicas.tools import offline

    spec = EngineSpec(target, draft, policy="fixed:k=0", max_k=max(KS), max_num_seqs=max(BATCHES))
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    out = []
    with engine_env.applied(engine_env.engine_env(tempfile.mkdtemp())):
        with offline.offline_llm(**speculative_engine_kwargs(spec)) as llm:
            for r in range(rounds):
                excess = []
                for batch in BATCHES:
                    for k in KS:
                        offline.set_policy(llm, f"fixed:k={k}")
                        cursor = offline.read_telemetry(llm).speculation.num_steps
                        prompts = [OPENINGS[i % len(OPENINGS)] + f" {i}" for i in range(batch)]
                        llm.generate(prompts, params, use_tqdm=False)
                        steps = [
                            1e3 * e["duration_s"]
                            for e in offline.read_step_log(llm, cursor)
                            if e["num_running"] == batch and e["num_batched_tokens"] == batch * (k + 1)
                        ]
                        if len(steps) >= 3:
                            excess.append(steps[0] - statistics.median(steps[1:]))
                row = {
                    "round": r,
                    "shapes": len(excess),
                    "median_ms": round(statistics.median(excess), 2),
                    "mean_ms": round(statistics.mean(excess), 2),
                    "max_ms": round(max(excess), 2),
                }
                print(f"{row}", file=sys.stderr)
                out.append(row)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--pair", choices=("trained", "perf"), default="trained")
    add_perf_options(parser, size="S", agreement=0.6)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds: {args.rounds} is not a positive number")
    from specserve.models import cached_pair
    from specserve.replicas.worker.shape_warmup import ENV_SWITCH

    options = {"size": args.size, "agreement": args.agreement} if args.pair == "perf" else {}
    pair = cached_pair(args.pair, **options)
    report: dict[str, Any] = {"pair": args.pair, **options, "batches": list(BATCHES), "ks": list(KS)}
    for setting in ("off", "on"):
        os.environ[ENV_SWITCH] = "1" if setting == "on" else "0"  # read by the engine process it starts
        print(f"warm-up {setting}", file=sys.stderr)
        report[f"warm_up_{setting}"] = run(str(pair.target), str(pair.draft), args.rounds)
    emit_report(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
