"""Measure a pair's greedy acceptance rates in a real vLLM engine (CPU settings of research/feasibility.md).

Acceptance at draft position j is ``accepted_per_pos[j] / num_drafts``, from vLLM's own counters
(``vllm:spec_decode_num_drafts``, ``vllm:spec_decode_num_accepted_tokens_per_pos``). With a fixed k,
every draft has k positions, so this is the probability that the first j+1 draft tokens are all
accepted. Mean acceptance length is ``1 + accepted / drafts``: tokens emitted per target step.

vLLM starts its EngineCore with the spawn method, so a script calling this needs an
``if __name__ == "__main__":`` guard. One measurement costs an engine start (about 15 s here).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specserve.models.build import PairPaths

# Python-flavoured openings, like the stdlib text the trained pair learned from.
PROMPTS = (
    "import os\nimport sys\n\n",
    "def main(argv=None):\n    ",
    "class Config:\n    def __init__(self, ",
    "    for name, value in ",
    "# Copyright (c) Python Software Foundation.\n",
    'if __name__ == "__main__":\n    ',
    "        return self.",
    "from collections import ",
    "    try:\n        ",
    "def _check(value):\n    \"\"\"Return ",
    "        if not isinstance(",
    "    @property\n    def ",
)

# Engine settings from research/feasibility.md §2: small, eager (no torch.compile), bf16.
ENGINE_KWARGS = dict(dtype="bfloat16", enforce_eager=True, max_model_len=512, max_num_seqs=8,
                     disable_log_stats=False, seed=0)


def measure_acceptance(
    pair: PairPaths, *, k: int = 4, num_prompts: int = 8, max_tokens: int = 64
) -> dict[str, object]:
    """Greedy-decode ``num_prompts`` prompts with draft-model speculation and return acceptance stats."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be at least 1, got {num_prompts}")
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(num_prompts)]
    with _engine_environment():
        from vllm import LLM, SamplingParams

        speculative_config = {"method": "draft_model", "model": str(pair.draft), "num_speculative_tokens": k}
        llm = LLM(model=str(pair.target), speculative_config=speculative_config, **ENGINE_KWARGS)
        try:
            before = _spec_counters(llm)
            started = time.monotonic()
            outputs = llm.generate(
                prompts,
                SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
                use_tqdm=False,
            )
            elapsed_s = time.monotonic() - started
            after = _spec_counters(llm)
        finally:
            llm.llm_engine.engine_core.shutdown()
            del llm
    num_drafts = after["drafts"] - before["drafts"]
    num_accepted = after["accepted"] - before["accepted"]
    accepted_per_pos = [a - b for a, b in zip(after["per_pos"], before["per_pos"], strict=True)]
    return {
        "target": str(pair.target),
        "draft": str(pair.draft),
        "k": k,
        "num_prompts": num_prompts,
        "max_tokens": max_tokens,
        "num_output_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
        "generate_s": round(elapsed_s, 3),
        "num_drafts": num_drafts,
        "num_draft_tokens": after["draft_tokens"] - before["draft_tokens"],
        "num_accepted_tokens": num_accepted,
        "num_accepted_per_pos": accepted_per_pos,
        "acceptance_per_pos": [round(a / num_drafts, 4) if num_drafts else 0.0 for a in accepted_per_pos],
        "mean_acceptance_length": round(1.0 + num_accepted / num_drafts, 4) if num_drafts else 1.0,
    }


def _spec_counters(llm: object) -> dict[str, object]:
    """Current values of vLLM's speculative-decoding counters, summed over label sets."""
    from vllm.v1.metrics.reader import Counter, Vector

    names = {
        "vllm:spec_decode_num_drafts": "drafts",
        "vllm:spec_decode_num_draft_tokens": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens": "accepted",
    }
    totals: dict[str, object] = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": []}
    for metric in llm.get_metrics():
        if isinstance(metric, Counter) and metric.name in names:
            totals[names[metric.name]] += metric.value
        elif isinstance(metric, Vector) and metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            per_pos = totals["per_pos"] or [0] * len(metric.values)
            totals["per_pos"] = [a + b for a, b in zip(per_pos, metric.values, strict=True)]
    return totals


@contextmanager
def _engine_environment() -> Iterator[None]:
    """CPU engine settings plus a private temp dir for vLLM's caches and IPC files, removed after."""
    scratch = Path(tempfile.mkdtemp(prefix="specserve-accept-"))
    overrides = {
        "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"),
        # vLLM leaves ZMQ socket files and vllm_dist_* files in TMPDIR; keep them in scratch.
        "TMPDIR": str(scratch),
    }
    defaults = {
        # The CPU backend otherwise tries to reserve most of RAM for the KV cache (GiB, integer).
        "VLLM_CPU_KVCACHE_SPACE": "1",
        # Both cores for OMP; the default "auto" keeps one core idle.
        "VLLM_CPU_OMP_THREADS_BIND": "0-1",
    }
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    if iomp.exists():
        # vLLM warns that CPU speculative decoding is much slower without Intel OpenMP preloaded.
        defaults["LD_PRELOAD"] = str(iomp)
    saved_env = {name: os.environ.get(name) for name in [*overrides, *defaults]}
    saved_tempdir = tempfile.tempdir
    os.environ.update(overrides)
    for name, value in defaults.items():
        os.environ.setdefault(name, value)
    tempfile.tempdir = str(scratch)
    try:
        yield
    finally:
        tempfile.tempdir = saved_tempdir
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(scratch, ignore_errors=True)
