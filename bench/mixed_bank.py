"""Builds ``specserve/bench/mixed_bank.json``, the prompt bank of the mixed workload (``specserve.bench.workload``),
from the bundled tiny target.

Why a bank drawn from the target and not hand-written code: the tiny target (4 layers, trained on 128-token
windows of stdlib Python, ``specserve.models.training``) neither copies from its context nor recites its corpus.
Probed with transformers, a line repeated three times in the prompt was not continued a fourth time, and over
2,000 corpus windows its greedy continuation of a 12-token prefix matched the corpus for at most 7 tokens. What
it does write reliably is its own greedy text: short attractors (a comment of its own words, ``def __init__(self,
other):`` stubs) it falls into from a given opening. So a copy prompt here is ``# Repeat NAME as NAME_copy:``,
the function ``NAME`` whose body is the target's own greedy text, and the renamed opening; the body is iterated to
a fixed point (write the prompt with body B, take the target's greedy answer as the next B) and kept only where
the answer equals the body exactly, so the target answers by re-stating a span of its prompt. Any other model
reads the same prompt as an instruction to repeat a block with one rename, which is a copy task too.

Openings are ``def NAME(ARGS):`` headers from the training corpus (``specserve.models.tokenizer.read_corpus``),
bare or with their body's first line; the free-form prompts are other openings, alone. A copy prompt stays within
``MAX_PROMPT_TOKENS`` so that with a 40-token answer the whole stays within the 128 tokens of the tiny tokenizer
the target was trained on. The bank holds text, not token ids, so it serves any endpoint; the fixed point holds
for vLLM's bf16 CPU numerics, and another backend's may flip a near-tie in a few blocks.

Run (a few minutes on a 2-core CPU): ``PYTHONPATH=$PWD .venv/bin/python bench/mixed_bank.py``. vLLM spawns its
EngineCore, so this script needs its ``__main__`` guard. It lives outside the package because the load generator
imports no vLLM beyond its benchmark helpers (docs/architecture.md).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from specserve.bench.workload import BANK_PATH, copy_prompt, opening

# Target tokens in a copy block: what a copy answer repeats. Prompt and answer stay within the training window.
BLOCK_TOKENS = 40
MAX_PROMPT_TOKENS = 88
FIXED_POINT_ROUNDS = 10
HEADER = re.compile(r"(?m)^def (\w+)\(([^)\n]*)\):\n(    [^\n]{4,40}\n)")


def headers(seed: int) -> list[tuple[str, str, str]]:
    """Distinct short function openings (header and first body line) of the training corpus, in a seeded order."""
    from specserve.models.tokenizer import read_corpus

    found = {m.groups() for text in read_corpus() for m in HEADER.finditer(text)}
    # Each header twice: bare, and with the first line of its body (another way into the target's text).
    fits = [(name, args, body) for name, args, body in found if len(name) <= 16 and len(args) <= 24]
    short = sorted({(name, args, first) for name, args, body in fits for first in ("", body)})
    random.Random(seed).shuffle(short)
    return short


def build(target: str, candidates: int, seed: int) -> dict[str, Any]:
    from vllm import SamplingParams

    from specserve.replicas.config import engine_env
    from specserve.replicas.tools.offline import MEASURE_ENGINE_KWARGS, offline_llm

    pool = headers(seed)
    tried, rest = pool[:candidates], pool[candidates:]
    params = SamplingParams(temperature=0.0, max_tokens=BLOCK_TOKENS, ignore_eos=True)
    scratch = tempfile.mkdtemp(prefix="specserve-bank-")
    try:
        with (
            engine_env.applied(engine_env.engine_env(scratch)),
            offline_llm(model=target, **MEASURE_ENGINE_KWARGS) as llm,
        ):
            tokenizer = llm.get_tokenizer()

            def answers(prompts: list[str]) -> list[str]:
                return [o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)]

            # The first body: what the target writes after the instruction and header alone.
            blocks = answers([f"# Repeat {n} as {n}_copy:\n{opening(n, a, f)}" for n, a, f in tried])
            for _ in range(FIXED_POINT_ROUNDS):
                prompts = [copy_prompt(n, a, f, b) for (n, a, f), b in zip(tried, blocks, strict=True)]
                again = answers(prompts)
                done = [b == g for b, g in zip(blocks, again, strict=True)]
                if all(done):
                    break
                blocks = again
            copies = [
                {"name": n, "args": a, "first": f, "block": b}
                for (n, a, f), b, ok in zip(tried, blocks, done, strict=True)
                if ok and len(tokenizer.encode(copy_prompt(n, a, f, b))) <= MAX_PROMPT_TOKENS
            ]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    free = [{"name": n, "args": a, "first": f} for n, a, f in rest[: max(len(copies), 1) * 2]]
    return {
        "about": "bench/mixed_bank.py: copy blocks the tiny trained target re-states (greedy, vLLM bf16)",
        "block_tokens": BLOCK_TOKENS,
        "seed": seed,
        "candidates": candidates,
        "copy": copies,
        "free": free,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=240, help="corpus openings tried as copy openings")
    parser.add_argument("--seed", type=int, default=0, help="order of the corpus headers")
    parser.add_argument("--out", type=Path, default=BANK_PATH)
    args = parser.parse_args(argv)
    from specserve.models.cache import cached_pair

    bank = build(str(cached_pair("trained").target), args.candidates, args.seed)
    args.out.write_text(json.dumps(bank, indent=1) + "\n", encoding="utf-8")
    print(f"{args.out}: {len(bank['copy'])} copy blocks of {args.candidates} candidates, {len(bank['free'])} free")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
