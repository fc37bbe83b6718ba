"""Prefix caching on against off, under one policy, on a shared-prefix chat workload: lossless, and tokens per step.

    PYTHONPATH=$PWD .venv/bin/python bench/prefix_caching.py [--policy adaptive] [--rounds 5] \
        [--conversations 8] [--turns 3] [--prefix-tokens 300] [--max-tokens 48] \
        [--out bench/results/prefix-caching-tiny]

Two offline engines (float32) on the bundled tiny pair under specserve's scheduler, one with vLLM's prefix caching (the
default) and one without, side by side in this process. Each round sends both the same conversations: a shared
system prompt of ``--prefix-tokens`` tokens (over two of the CPU build's 128-token blocks) and a question of its
own each, then ``--turns`` turns, every turn's prompt the last one plus its answer, so later turns hit blocks whose
tokens were decoded (at whatever k the policy chose, k = 0 included). The engines take turns within a round, first
one then the other, the order alternating by round. Per engine and round: output tokens per engine step (the
engine's telemetry), prompt tokens served from the cache (vLLM's ``num_cached_tokens`` per request), and whether
every greedy output equals the other engine's. ``--policy fixed:k=4`` shows what a hit costs with speculation
always on. Prints a table; writes PREFIX.json, PREFIX.md and PREFIX.png.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from specserve.bench.stats import median_interval


def conversation_prompts(tokenizer, conversations: int, prefix_tokens: int) -> list[list[int]]:
    from specserve.models.prompts import OPENINGS

    system = tokenizer.encode(" ".join(OPENINGS) * 20)[:prefix_tokens]
    return [system + tokenizer.encode(f"\n# question {i}: {OPENINGS[i % len(OPENINGS)]}") for i in range(conversations)]


def run_round(llm, prompts: list[list[int]], turns: int, max_tokens: int) -> tuple[list[list[int]], dict]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from specserve.replicas.tools.offline import read_telemetry

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    before = read_telemetry(llm)
    cached = 0
    outputs: list[list[int]] = []
    current = [list(p) for p in prompts]
    for _ in range(turns):
        done = llm.generate([TokensPrompt(prompt_token_ids=p) for p in current], params, use_tqdm=False)
        answers = [list(o.outputs[0].token_ids) for o in done]
        cached += sum(o.num_cached_tokens or 0 for o in done)
        outputs += answers
        current = [p + a for p, a in zip(current, answers, strict=True)]
    after = read_telemetry(llm)
    steps = after.speculation.num_steps - before.speculation.num_steps
    emitted = after.speculation.num_emitted_tokens - before.speculation.num_emitted_tokens
    return outputs, {
        "tokens_per_step": emitted / steps,
        "steps": steps,
        "cached_prompt_tokens": cached,
        "catch_up_tokens": after.speculation.num_catch_up_tokens - before.speculation.num_catch_up_tokens,
        "mean_k": float(
            np.dot(
                np.arange(len(after.speculation.num_steps_by_k)),
                np.subtract(after.speculation.num_steps_by_k, before.speculation.num_steps_by_k),
            )
        )
        / max(steps, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="adaptive")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--prefix-tokens", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--out", default="bench/results/prefix-caching-tiny")
    args = parser.parse_args()

    from contextlib import ExitStack

    from transformers import AutoTokenizer

    from specserve.models import cached_pair
    from specserve.replicas.config import engine_env
    from specserve.replicas.config.engine_args import EngineSpec, speculative_engine_kwargs
    from specserve.replicas.tools.offline import offline_llm, set_policy

    pair = cached_pair("trained")
    tokenizer = AutoTokenizer.from_pretrained(str(pair.target))
    prompts = conversation_prompts(tokenizer, args.conversations, args.prefix_tokens)
    rows: list[dict] = []
    identical = True
    scratch = Path(tempfile.mkdtemp(prefix="prefix-caching-"))
    with engine_env.applied(engine_env.engine_env(scratch)), ExitStack() as stack:
        # float32: greedy tokens compared across batch shapes, which bf16 GEMMs round differently on some CPUs.
        spec = EngineSpec(str(pair.target), str(pair.draft), args.policy, max_k=4, max_model_len=1024, dtype="float32")
        engines = {
            caching: stack.enter_context(offline_llm(**speculative_engine_kwargs(spec), enable_prefix_caching=caching))
            for caching in (True, False)
        }
        for round_index in range(args.rounds):
            order = (True, False) if round_index % 2 == 0 else (False, True)
            results = {}
            for caching in order:
                set_policy(engines[caching], args.policy, warm_start=False)
                outputs, row = run_round(engines[caching], prompts, args.turns, args.max_tokens)
                results[caching] = outputs
                rows.append({"round": round_index, "prefix_caching": caching, **row})
                print(f"round {round_index + 1}: prefix caching {'on' if caching else 'off'}: {row}", file=sys.stderr)
            identical &= results[True] == results[False]
    on = [r["tokens_per_step"] for r in rows if r["prefix_caching"]]
    off = [r["tokens_per_step"] for r in rows if not r["prefix_caching"]]
    interval = median_interval([a / b for a, b in zip(on, off, strict=True)])
    document = {
        "command": " ".join(sys.argv),
        "settings": vars(args),
        "rows": rows,
        "greedy_outputs_identical": identical,
        "tokens_per_step_ratio_on_off": {"median": interval.value, "interval_95": [interval.low, interval.high]},
    }
    prefix = Path(args.out)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    prefix.with_suffix(".json").write_text(json.dumps(document, indent=2) + "\n")
    prefix.with_suffix(".md").write_text(page(document))
    plot(rows, args.policy, prefix.with_suffix(".png"))
    print(page(document))
    return 0


def page(document: dict) -> str:
    lines = [
        "# Prefix caching on against off, one policy, a shared-prefix chat workload (tiny pair, offline engines)",
        "",
        f"`{document['command']}`",
        "",
        "| round | prefix caching | tokens per step | steps | mean k | cached prompt tokens | draft catch-up tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in document["rows"]:
        lines.append(
            f"| {r['round'] + 1} | {'on' if r['prefix_caching'] else 'off'} | {r['tokens_per_step']:.3f} | "
            f"{r['steps']} | {r['mean_k']:.2f} | {r['cached_prompt_tokens']} | {r['catch_up_tokens']} |"
        )
    ratio = document["tokens_per_step_ratio_on_off"]
    low, high = ratio["interval_95"]
    lines += [
        "",
        f"Tokens per step, on ÷ off, median over rounds: **{ratio['median']:.3f}** [{low:.3f}, {high:.3f}]. "
        f"Greedy outputs identical on and off in every round: **{document['greedy_outputs_identical']}**.",
    ]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], policy: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for caching, marker in ((True, "o"), (False, "s")):
        points = [(r["round"] + 1, r["tokens_per_step"]) for r in rows if r["prefix_caching"] is caching]
        ax.plot(*zip(*points, strict=True), marker=marker, label=f"prefix caching {'on' if caching else 'off'}")
    ax.set_xlabel("round")
    ax.set_ylabel("output tokens per engine step")
    ax.set_title(f"{policy}, shared-prefix chat, tiny pair")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
