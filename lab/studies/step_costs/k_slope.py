"""What a step-cost fit learned from one k says about the others: adaptive's fit (``StepLatencyModel``, ``HINGED``)
trained on each fixed-k run of a step log alone, as a policy held at that k would learn it, then asked the step time
of every k at one batch size; beside it the step times the fixed runs of each k measured there.

    specserve serve --config CONFIG   # with  step_log: /tmp/steps.jsonl  in CONFIG
    specserve bench compare ... --policies fixed:k=2,fixed:k=3,fixed:k=4,...
    PYTHONPATH=$PWD .venv/bin/python lab/studies/step_costs/k_slope.py /tmp/steps.jsonl --batch 4 [--json OUT]

Only decode steps count as measured (no prefill chunk, every request verifying k drafts), at the batch size given;
the fit predicts at their median context. A fit that prices each further k as the fixed runs measure it needs no
exploration to pick k; one that does not depends on its explorations to correct it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import numpy as np

from lab.experiments.policy_replay import load_log_arg, runs
from specserve.speculation import StepRecord
from specserve.speculation.estimators.step_latency import HINGED, StepLatencyModel
from specserve.speculation.step_log import LoggedStep


def decode_steps(steps: list[LoggedStep], batch: int) -> list[LoggedStep]:
    return [
        s
        for s in steps
        if s.record.num_running == batch
        and s.ctx.num_prefill_tokens == 0
        and s.record.num_batched_tokens == batch * (s.record.k + 1)
    ]


def fitted_row(runs: Iterable[list[StepRecord]], context: float, batch: int, ks: list[int]) -> list[float]:
    """The median over ``runs`` of a fit trained on one run, asked each k's step time at ``batch``."""
    per_run = []
    for run in runs:
        fit = StepLatencyModel(HINGED)
        for record in run:
            fit.observe(record)
        per_run.append([fit.predict(context, batch * (j + 1), j, batch) for j in ks])
    return np.median(np.array(per_run), axis=0).tolist()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="a step log (JSON lines) with fixed-k runs of two k or more")
    parser.add_argument("--batch", type=int, default=4, help="decoding requests of the steps compared")
    parser.add_argument("--min-steps", type=int, default=200, help="shortest fixed run used")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    if args.batch < 1:
        parser.error(f"--batch {args.batch}: must be at least 1")
    steps = load_log_arg(parser, args.log)
    by_k: dict[int, list[list[LoggedStep]]] = defaultdict(list)
    for start, stop in runs(steps, "fixed"):
        if stop - start >= args.min_steps:
            by_k[steps[start].record.k].append(steps[start:stop])
    if len(by_k) < 2:
        parser.error(f"log: fixed runs of {len(by_k)} k of at least {args.min_steps} steps; two k or more needed")
    at_batch = {k: [decode_steps(run, args.batch) for run in rs] for k, rs in by_k.items()}
    context = float(np.median([s.record.num_context_tokens for rs in at_batch.values() for r in rs for s in r]))
    measured = {
        k: float(np.median([np.mean([s.record.duration_s for s in r]) for r in rs if r])) for k, rs in at_batch.items()
    }
    ks = list(range(max(by_k) + 1))
    timed = all(s.record.forward_s is not None and s.record.draft_s is not None for s in steps)
    predicted: dict[int, list[float]] = {}
    predicted_whole: dict[int, list[float]] = {}
    for k, rs in sorted(by_k.items()):
        predicted[k] = fitted_row(([s.record for s in run] for run in rs), context, args.batch, ks)
        if timed:  # the same fit on whole steps, as an engine that does not time the parts teaches it
            predicted_whole[k] = fitted_row(
                ([replace(s.record, forward_s=None, draft_s=None) for s in run] for run in rs), context, args.batch, ks
            )
    print(
        f"batch {args.batch}, median context {context:.0f} tokens; fixed runs per k: "
        + ", ".join(f"k={k}: {len(rs)}" for k, rs in sorted(by_k.items()))
    )
    print("measured ms: " + "  ".join(f"k={k} {1e3 * v:5.1f}" for k, v in sorted(measured.items())))
    for label, rows in (("timed parts" if timed else "whole steps", predicted), ("whole steps", predicted_whole)):
        for k, row in rows.items():
            slope = (row[-1] - row[1]) / max(len(ks) - 2, 1)
            print(
                f"fit on k={k} runs ({label}), ms: "
                + "  ".join(f"k={j} {1e3 * v:5.1f}" for j, v in enumerate(row))
                + f"  | per further k {1e3 * slope:4.1f}"
            )
    lo, hi = min(measured), max(measured)
    print(f"measured per further k: {1e3 * (measured[hi] - measured[lo]) / max(hi - lo, 1):4.1f}")
    ordered = sorted(measured)
    print(
        "measured from one k to the next, ms: "
        + "  ".join(f"k={a}->{b} {1e3 * (measured[b] - measured[a]) / (b - a):4.1f}" for a, b in pairwise(ordered))
    )
    parts: dict[int, list[float]] = {}
    if timed:
        for k, rs in sorted(at_batch.items()):
            split = np.array([[s.record.forward_s, s.record.draft_s, s.record.duration_s] for r in rs for s in r])
            forward_s, draft_s, whole_s = np.mean(split, axis=0)
            parts[k] = [float(forward_s), float(draft_s), float(whole_s - forward_s - draft_s)]
        print(
            "measured parts (target pass / draft passes / rest), ms: "
            + "  ".join(f"k={k} {'/'.join(f'{1e3 * v:.1f}' for v in p)}" for k, p in parts.items())
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "log": str(args.log),
                    "batch": args.batch,
                    "context_tokens": context,
                    "runs_per_k": {k: len(rs) for k, rs in sorted(by_k.items())},
                    "measured_s": measured,
                    "predicted_s_by_fit_k": predicted,
                    "parts_timed": timed,
                    "measured_parts_s": parts,
                    "predicted_whole_s_by_fit_k": predicted_whole,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
