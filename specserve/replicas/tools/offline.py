"""A vLLM engine in this process, outside Ray Serve: to measure a model pair, and for the engine tests.

Private vLLM interface used (pinned: vLLM 0.32.0): ``LLM.llm_engine.engine_core``, the EngineCore
client, to call specserve's utility methods and to shut the EngineCore process down when the engine
is done with rather than whenever it is garbage-collected. Everything else is vLLM's public API.

vLLM starts its EngineCore with the spawn method, so a script using this needs an
``if __name__ == "__main__":`` guard. Each engine start costs about 15 s on a 2-core CPU.
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from specserve.messages import EngineTelemetry, MemoryDecision
from specserve.replicas.config import engine_env
from specserve.replicas.config.engine_args import (
    Utility,
)

# Plain vLLM draft-model speculation at the sizes `specserve serve` uses by default (EngineSpec):
# bf16, eager (torch.compile would add about 35 s to each start on CPU), 512-token context,
# 8 sequences. Stats logging on: the measurement reads vLLM's own counters.
MEASURE_ENGINE_KWARGS = dict(
    dtype="bfloat16", enforce_eager=True, max_model_len=512, max_num_seqs=8, disable_log_stats=False, seed=0
)


@contextmanager
def offline_llm(**engine_kwargs: Any) -> Iterator[Any]:
    """vLLM's ``LLM`` built in this process; its EngineCore process stops when the block ends."""
    from vllm import LLM

    llm = LLM(**engine_kwargs)
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def set_policy(llm: Any, spec: str, warm_start: bool = True) -> str:
    """Switch the policy of an engine built with specserve's scheduler; returns the canonical spec. Without
    ``warm_start`` the policy starts from its priors instead of the engine's last steps."""
    return llm.llm_engine.engine_core.call_utility(Utility.SET_POLICY, spec, warm_start)


def seed_acceptance(llm: Any, accepted: list[float], reached: list[float]) -> None:
    """Hand the engine a controller's acceptance prior (peers' decayed counts per position)."""
    llm.llm_engine.engine_core.call_utility(Utility.SEED_ACCEPTANCE, accepted, reached)


def offload_draft(llm: Any) -> dict[str, Any]:
    """Drop the engine's draft and grow its KV pool into the draft's bytes; returns the memory state."""
    return llm.llm_engine.engine_core.call_utility(Utility.OFFLOAD_DRAFT)


def reload_draft(llm: Any) -> dict[str, Any]:
    """Contract the pool (migrating its grown region's live blocks, or waiting for free blocks to take them),
    then start rebuilding the draft in the background; returns the memory state."""
    return llm.llm_engine.engine_core.call_utility(Utility.RELOAD_DRAFT)


def wait_for_draft(llm: Any, states: tuple[str, ...], timeout_s: float = 120.0) -> dict[str, Any]:
    """Poll the memory state until the draft is in one of ``states`` (an idle engine adopts a rebuilt draft on
    the poll itself); raises TimeoutError with the last state."""
    deadline = time.monotonic() + timeout_s
    while (memory := draft_memory(llm))["state"] not in states:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the draft is still {memory['state']} after {timeout_s:g} s: {memory}")
        time.sleep(0.05)
    return memory


def draft_memory(llm: Any) -> dict[str, Any]:
    return llm.llm_engine.engine_core.call_utility(Utility.DRAFT_MEMORY)


def memory_directive(llm: Any, decision: MemoryDecision) -> None:
    """Apply a controller's memory decision (a ``MemoryDirective``'s kind) as the replica does."""
    llm.llm_engine.engine_core.call_utility(Utility.MEMORY_DIRECTIVE, decision.value)


def memory_coordinated(llm: Any, coordinated: bool) -> None:
    """Whether a controller grants the engine's draft transfers (true) or the engine itself (false)."""
    llm.llm_engine.engine_core.call_utility(Utility.MEMORY_COORDINATED, coordinated)


def read_telemetry(llm: Any, since_step: int = 0) -> EngineTelemetry:
    """One pure read of an engine built with specserve's scheduler (durations after ``since_step``)."""
    return EngineTelemetry.from_dict(llm.llm_engine.engine_core.call_utility(Utility.TELEMETRY, since_step))


def read_step_log(llm: Any, since_step: int = 0) -> list[dict[str, Any]]:
    """The engine's records of the steps after ``since_step`` (as far as its ring buffer reaches)."""
    return llm.llm_engine.engine_core.call_utility(Utility.STEP_LOG, since_step)


def measure_speculation(target: str, draft: str, prompts: list[str], *, k: int, max_tokens: int) -> dict[str, Any]:
    """Greedy-decode ``prompts`` with vLLM's draft-model speculation at a fixed ``k``; returns vLLM's
    speculative-decoding counters over the run and the generation time."""
    scratch = tempfile.mkdtemp(prefix="specserve-measure-")
    try:
        with engine_env.applied(engine_env.engine_env(scratch)):
            from vllm import SamplingParams

            speculative_config = {"method": "draft_model", "model": draft, "num_speculative_tokens": k}
            with offline_llm(model=target, speculative_config=speculative_config, **MEASURE_ENGINE_KWARGS) as llm:
                before = spec_decode_counters(llm)
                started = time.monotonic()
                params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
                outputs = llm.generate(prompts, params, use_tqdm=False)
                elapsed_s = time.monotonic() - started
                after = spec_decode_counters(llm)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "num_output_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
        "generate_s": round(elapsed_s, 3),
        "num_drafts": after["drafts"] - before["drafts"],
        "num_draft_tokens": after["draft_tokens"] - before["draft_tokens"],
        "num_accepted_tokens": after["accepted"] - before["accepted"],
        "num_accepted_per_pos": [a - b for a, b in zip(after["per_pos"], before["per_pos"], strict=True)],
    }


def acceptance_on(llm: Any, prompts: list[str], k: int, max_tokens: int) -> dict[str, Any]:
    """Greedy-decode ``prompts`` on an engine built with specserve's scheduler at ``fixed:k={k}``: the drafts each
    position reached and had accepted over the run, as the scheduler counted them."""
    from vllm import SamplingParams

    set_policy(llm, f"fixed:k={k}", warm_start=False)
    before = read_telemetry(llm).speculation
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
    after = read_telemetry(llm).speculation
    return {
        name: [a - b for a, b in zip(getattr(after, name), getattr(before, name), strict=True)]
        for name in ("num_reached_per_pos", "num_accepted_per_pos")
    }


def spec_decode_counters(llm: Any) -> dict[str, Any]:
    """Current values of vLLM's speculative-decoding counters, summed over label sets."""
    from vllm.v1.metrics.reader import Counter, Vector

    names = {
        "vllm:spec_decode_num_drafts": "drafts",
        "vllm:spec_decode_num_draft_tokens": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens": "accepted",
    }
    totals: dict[str, Any] = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": []}
    for metric in llm.get_metrics():
        if isinstance(metric, Counter) and metric.name in names:
            totals[names[metric.name]] += metric.value
        elif isinstance(metric, Vector) and metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            per_pos = totals["per_pos"] or [0] * len(metric.values)
            totals["per_pos"] = [a + b for a, b in zip(per_pos, metric.values, strict=True)]
    return totals
