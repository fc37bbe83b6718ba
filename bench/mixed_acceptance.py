"""Acceptance per class of the mixed workload on the tiny trained target, from vLLM's own counters.

One plain offline ``vllm.LLM`` per speculation method (bf16, eager, greedy, ``ignore_eos``), the workload's first
requests sent one class at a time, and vLLM's spec-decode counters (``spec_decode_counters``) read around each
class: acceptance = accepted draft tokens / draft tokens. Methods: prompt-lookup ``ngram`` (k = 4, n-grams of 2-4
tokens) and the pair's distilled ``draft_model`` (k = 4).

``PYTHONPATH=$PWD .venv/bin/python bench/mixed_acceptance.py [--requests 40] [--output-len 40] [--seed 0]
[--out FILE]``; prints one JSON document last on stdout (vLLM's log lines come before it) and writes it to
``--out``. vLLM spawns its EngineCore, so this script needs its ``__main__`` guard.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from specserve.bench.workload import CLASSES, MixedWorkload

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def draft_config(draft: str) -> dict[str, Any]:
    return {"method": "draft_model", "model": draft, "num_speculative_tokens": 4}


def class_prompts(seed: int, requests: int, copy_share: float = 0.5) -> dict[str, list[str]]:
    """The workload's first ``requests`` prompts, by class."""
    workload = MixedWorkload(seed, copy_share)
    found: dict[str, list[str]] = {name: [] for name in CLASSES}
    for request in workload.requests(requests):
        found[str(request.request_class)].append(request.text)
    return found


def acceptance(llm: Any, prompts: list[str], max_tokens: int) -> dict[str, Any]:
    """Greedy-decode ``prompts`` on ``llm``; vLLM's spec-decode counters over that call."""
    from vllm import SamplingParams

    from specserve.replicas.tools.offline import spec_decode_counters

    before = spec_decode_counters(llm)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    after = spec_decode_counters(llm)
    drafted = after["draft_tokens"] - before["draft_tokens"]
    accepted = after["accepted"] - before["accepted"]
    return {
        "requests": len(prompts),
        "output_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
        "drafts": after["drafts"] - before["drafts"],
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance": accepted / drafted if drafted else None,
        "texts": [o.outputs[0].text for o in outputs],
    }


def measure(
    target: str, speculative_config: dict[str, Any], prompts: dict[str, list[str]], max_tokens: int
) -> dict[str, dict[str, Any]]:
    """Each class's acceptance under one speculation method, on one engine (classes sent one after the other)."""
    from specserve.replicas.config import engine_env
    from specserve.replicas.tools.offline import MEASURE_ENGINE_KWARGS, offline_llm

    scratch = tempfile.mkdtemp(prefix="specserve-mixed-")
    try:
        with (
            engine_env.applied(engine_env.engine_env(scratch)),
            offline_llm(model=target, speculative_config=speculative_config, **MEASURE_ENGINE_KWARGS) as llm,
        ):
            return {name: acceptance(llm, class_prompts, max_tokens) for name, class_prompts in prompts.items()}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40, help="the workload's first N requests (default 40)")
    parser.add_argument("--output-len", type=int, default=40, help="max_tokens of each (default 40)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also write the JSON document here")
    args = parser.parse_args(argv)
    from specserve.models.cache import cached_pair

    pair = cached_pair("trained")
    prompts = class_prompts(args.seed, args.requests)
    result: dict[str, Any] = {"requests": args.requests, "output_len": args.output_len, "seed": args.seed}
    for label, config in (("ngram", NGRAM), ("draft_model", draft_config(str(pair.draft)))):
        measured = measure(str(pair.target), config, prompts, args.output_len)
        result[label] = {name: {k: v for k, v in m.items() if k != "texts"} for name, m in measured.items()}
    document = json.dumps(result, indent=1)
    if args.out is not None:
        args.out.write_text(document + "\n", encoding="utf-8")
    print(document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
