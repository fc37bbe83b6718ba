"""What the draft's confidences buy on the real engine: policies that read them against the same policy blind.

Starts one vLLM engine (CPU) and, for each batch size, runs the same greedy requests under each policy in
interleaved rounds (A B C A B C: drift on this shared 2-core machine hits every policy alike). Per run it records
output tokens/s, the drafts verified and accepted, and the draft lists cut to their confident prefix before
verification (``num_drafts_cut_by_confidence``). Prints one JSON line per run and, at the end, the median per
policy and batch of the per-round ratio to the first policy; writes all of it to ``--out``.json and a plot to
``--out``.png.

    .venv/bin/python lab/studies/confident_prefix/confident_prefix.py \
        [--pair perf --size S --agreement 0.6] [--batches 1,4,8]
        [--policies adaptive,adaptive:verify_confident_prefix=true,slo] [--rounds 3] [--max-tokens 128]
        [--out bench/results/confident_prefix]

The variant it measured, ``adaptive:verify_confident_prefix=true`` (the draft loop's stop rule asked before
verification, to cut vLLM's drafts to their confident prefix), is gone (issue 60): it gained nothing measurable
here and cost served steps, and a spec naming it is refused with an error naming the parameter. The default
``--policies`` is kept as the record of the runs in bench/results/confident_prefix-*.json (see
docs/policies/adaptive.md, "How we got here"); pass ``--policies`` with policies that exist to run it now.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from specserve.models.arguments import add_perf_options

OPENINGS = ["def f(x):\n    ", "import os\n", "class A:\n    ", "for i in range(10):\n", "# utils\n", "x = ["]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", default="adaptive,adaptive:verify_confident_prefix=true,slo")
    parser.add_argument("--batches", default="1,4,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--pair", choices=("trained", "perf"), default="perf")
    parser.add_argument("--out", type=Path, default=Path("bench/results/confident_prefix"))
    add_perf_options(parser, size="S", agreement=0.6)
    args = parser.parse_args()
    policies = args.policies.split(",")
    batches = [int(b) for b in args.batches.split(",")]

    from vllm import SamplingParams

    from specserve.models import cached_pair
    from specserve.replicas.config import engine_env
    from specserve.replicas.config.engine_args import EngineSpec, speculative_engine_kwargs
    from specserve.replicas.tools.offline import offline_llm, read_telemetry, set_policy

    options = {"size": args.size, "agreement": args.agreement} if args.pair == "perf" else {}
    pair = cached_pair(args.pair, **options)
    label = args.pair if args.pair == "trained" else f"perf-{args.size}-a{args.agreement}"
    spec = EngineSpec(
        target=str(pair.target), draft=str(pair.draft), policy="fixed:k=0", max_k=4, max_num_seqs=max(batches)
    )
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    env = engine_env.engine_env(tempfile.mkdtemp(prefix="specserve-bench-"), num_cpus=2)
    rows = []
    with engine_env.applied(env), offline_llm(**speculative_engine_kwargs(spec)) as llm:
        llm.generate(OPENINGS[:2], params, use_tqdm=False)  # warm-up
        for batch in batches:
            prompts = [OPENINGS[i % len(OPENINGS)] + f"# {i}\n" for i in range(batch)]
            for round_ in range(args.rounds):
                for policy in policies:
                    set_policy(llm, policy)
                    before = read_telemetry(llm)
                    started = time.perf_counter()
                    outputs = llm.generate(prompts, params, use_tqdm=False)
                    seconds = time.perf_counter() - started
                    after = read_telemetry(llm)
                    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
                    drafted = sum(after.speculation.num_drafted_per_pos) - sum(before.speculation.num_drafted_per_pos)
                    accepted = sum(after.speculation.num_accepted_per_pos) - sum(
                        before.speculation.num_accepted_per_pos
                    )
                    row = {
                        "pair": label,
                        "batch": batch,
                        "round": round_,
                        "policy": policy,
                        "tok_s": round(tokens / seconds, 2),
                        "drafted": drafted,
                        "accepted": accepted,
                        "cut_by_confidence": after.speculation.num_drafts_cut_by_confidence
                        - before.speculation.num_drafts_cut_by_confidence,
                        "steps": after.speculation.num_steps - before.speculation.num_steps,
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    summary = summarise(rows, policies, batches)
    for line in summary:
        print(json.dumps(line), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"runs": rows, "summary": summary}, indent=1) + "\n")
    plot(summary, policies, batches, args.out.with_suffix(".png"), label)


def summarise(rows: list[dict], policies: list[str], batches: list[int]) -> list[dict]:
    """Per policy and batch: median tok/s, and the median over rounds of the ratio to the first policy."""
    out = []
    for batch in batches:
        base = {r["round"]: r["tok_s"] for r in rows if r["batch"] == batch and r["policy"] == policies[0]}
        for policy in policies:
            mine = [r for r in rows if r["batch"] == batch and r["policy"] == policy]
            ratios = [r["tok_s"] / base[r["round"]] for r in mine]
            out.append(
                {
                    "batch": batch,
                    "policy": policy,
                    "median_tok_s": round(statistics.median(r["tok_s"] for r in mine), 2),
                    "median_ratio": round(statistics.median(ratios), 3),
                    "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
                    "acceptance": round(sum(r["accepted"] for r in mine) / max(1, sum(r["drafted"] for r in mine)), 3),
                    "cut_by_confidence": sum(r["cut_by_confidence"] for r in mine),
                }
            )
    return out


def plot(summary: list[dict], policies: list[str], batches: list[int], path: Path, label: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(policies)
    for i, policy in enumerate(policies):
        values = [
            next(s["median_ratio"] for s in summary if s["batch"] == b and s["policy"] == policy) for b in batches
        ]
        ax.bar([j + i * width for j in range(len(batches))], values, width, label=policy)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks([j + width * (len(policies) - 1) / 2 for j in range(len(batches))], [str(b) for b in batches])
    ax.set_xlabel("concurrent greedy requests")
    ax.set_ylabel(f"output tok/s ÷ {policies[0]}")
    ax.set_title(f"confidence-driven verification, {label} (median of interleaved rounds)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
