"""What a shared acceptance prior buys a replica that joins: a fresh engine cold against one seeded with a peer's.

A donor engine runs the workload under ``adaptive`` and its telemetry's decayed acceptance evidence per draft
position becomes the prior, as the controller hands it to a joining replica (``AcceptancePrior``). Then, per
round, two fresh engines run the same workload once from their first step: one cold (the policy's 0.5 prior per
position), one seeded with the donor's evidence (``seed_acceptance``); the order alternates between rounds.
Per engine it records output tokens/s of that first run, the k of its first steps and the mean k. Prints one
JSON line per engine and a summary, writes ``--out``.json and a plot of k over the first steps to ``--out``.png.

    .venv/bin/python lab/studies/acceptance_prior/acceptance_prior.py [--pair perf --size S --agreement 0.8] [--batch 4]
        [--max-tokens 64] [--rounds 3] [--out bench/results/acceptance_prior]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from specserve.models.arguments import add_perf_options

OPENINGS = ["def f(x):\n    ", "import os\n", "class A:\n    ", "for i in range(10):\n", "# utils\n", "x = ["]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pair", choices=("trained", "perf"), default="perf")
    parser.add_argument("--out", type=Path, default=Path("bench/results/acceptance_prior"))
    add_perf_options(parser, size="S", agreement=0.8)
    args = parser.parse_args()

    from specserve.models import cached_pair

    options = {"size": args.size, "agreement": args.agreement} if args.pair == "perf" else {}
    pair = cached_pair(args.pair, **options)
    label = args.pair if args.pair == "trained" else f"perf-{args.size}-a{args.agreement}"
    prompts = [OPENINGS[i % len(OPENINGS)] + f"# {i}\n" for i in range(args.batch)]

    print("donor: running the workload to collect its acceptance evidence", file=sys.stderr, flush=True)
    donor = run_engine(pair, prompts, args.max_tokens, prior=None, repeats=3)
    prior = (donor["prior_accepted"], donor["prior_reached"])
    rows = []
    for round_ in range(args.rounds):
        order = ("cold", "seeded") if round_ % 2 == 0 else ("seeded", "cold")
        for variant in order:
            print(f"round {round_}: {variant}", file=sys.stderr, flush=True)
            result = run_engine(pair, prompts, args.max_tokens, prior=prior if variant == "seeded" else None)
            row = {"pair": label, "round": round_, "variant": variant, **{k: result[k] for k in REPORTED}}
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary = summarise(rows)
    print(json.dumps(summary), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    document = {"pair": label, "batch": args.batch, "max_tokens": args.max_tokens, "donor": donor, "runs": rows}
    args.out.with_suffix(".json").write_text(json.dumps({**document, "summary": summary}, indent=1) + "\n")
    plot(rows, args.out.with_suffix(".png"), label, args.batch)


REPORTED = ("tok_s", "mean_k", "first_ks", "acceptance_prior_used")


def run_engine(pair: Any, prompts: list[str], max_tokens: int, prior: Any, repeats: int = 1) -> dict[str, Any]:
    """One fresh engine under ``adaptive``, seeded with ``prior`` if given; the workload ``repeats`` times."""
    from vllm import SamplingParams

    from specserve.replicas.config import engine_env
    from specserve.replicas.config.engine_args import EngineSpec, speculative_engine_kwargs
    from specserve.replicas.tools.offline import offline_llm, read_step_log, read_telemetry, seed_acceptance

    spec = EngineSpec(
        target=str(pair.target), draft=str(pair.draft), policy="adaptive", max_k=4, max_num_seqs=len(prompts)
    )
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    env = engine_env.engine_env(tempfile.mkdtemp(prefix="specserve-bench-"), num_cpus=2)
    with engine_env.applied(env), offline_llm(**speculative_engine_kwargs(spec)) as llm:
        if prior is not None:
            seed_acceptance(llm, *prior)
        started = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - started
        for _ in range(repeats - 1):
            llm.generate(prompts, params, use_tqdm=False)
        telemetry = read_telemetry(llm)
        steps = read_step_log(llm)
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    first = [s["k"] for s in steps[: 2 * max_tokens] if s["num_running"] > 0]
    return {
        "tok_s": round(tokens / seconds, 2),
        "mean_k": round(statistics.mean(first), 3) if first else 0.0,
        "first_ks": first[:40],
        "acceptance_prior_used": prior is not None,
        "prior_accepted": list(telemetry.acceptance_ema.accepted_per_pos),
        "prior_reached": list(telemetry.acceptance_ema.reached_per_pos),
        "acceptance_ema_per_pos": list(telemetry.acceptance_ema.per_pos),
    }


def summarise(rows: list[dict]) -> dict[str, Any]:
    """Per round the seeded engine's tok/s over the cold one's; medians."""
    rounds = sorted({r["round"] for r in rows})
    by = {(r["round"], r["variant"]): r for r in rows}
    ratios = [by[(n, "seeded")]["tok_s"] / by[(n, "cold")]["tok_s"] for n in rounds]
    return {
        "seeded_over_cold_tok_s": {
            "median": round(statistics.median(ratios), 3),
            "per_round": [round(x, 3) for x in ratios],
        },
        "mean_k": {
            variant: round(statistics.median(r["mean_k"] for r in rows if r["variant"] == variant), 3)
            for variant in ("cold", "seeded")
        },
    }


def plot(rows: list[dict], path: Path, label: str, batch: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    colours = {"cold": "tab:blue", "seeded": "tab:orange"}
    for row in rows:
        ax.plot(row["first_ks"], color=colours[row["variant"]], alpha=0.6, drawstyle="steps-post")
    for variant, colour in colours.items():
        ax.plot([], [], color=colour, label=variant)
    ax.set_xlabel("engine step from start")
    ax.set_ylabel("k")
    ax.set_title(f"adaptive's first steps on a fresh engine, {label}, batch {batch}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
