"""Warm a CPU engine's decode shapes at start-up, so that a policy which varies k does not pay to meet them.

vLLM 0.32.0's CPU path runs every linear layer (the LM heads included) through a oneDNN matmul primitive that it
builds for each exact row count M the first time that M runs, and keeps per weight shape in a cache of 32 (least
recently used). A decode step at batch B and k runs M = B (k + 1) rows through the target and the draft, so a policy
that varies k meets up to ``max_num_seqs`` x (``max_k`` + 1) row counts, each built on its first step: measured on
the tiny pair (``lab/studies/shape_warmup/shape_warmup.py``, 40 shapes), the first step at a new (batch, k) took 3.8
ms more than that shape's later steps at the median, 6.5 ms on average and up to 24 ms (its steps take 5-15 ms); a
second round over the same shapes paid 0.2-0.5 ms. A fixed k meets a handful of them and is warm within seconds. An
adaptive policy instead learns the build as the price of the k it explored and keeps away from it: on the tiny pair
it priced k = 2 at batch 8 at 14.5 ms where a fixed k = 2 measured 8.9. A GPU engine does not have this problem:
vLLM captures CUDA graphs for its decode sizes at start-up. On CPU it warms one size. With the warm-up, the first
step at a new shape costs 0.35 ms more at the median, 0.8 ms on average.

So on a CPU engine (``install``, run in the worker process by the worker extension's ``install``):

- each weight shape's primitive cache is made large enough to hold every decode row count beside the prefill
  sizes (``PRIMITIVE_CACHE_SIZE``); 32 would evict what the warm-up built;
- after vLLM's own warm-up, every M from 1 to ``max_num_seqs`` x (max_k + 1) runs once through the target
  (its layers and LM head, ``_dummy_run``, which runs the draft's layers at M too) and every batch size through
  the draft's LM head.

Prefill chunks of other sizes still build theirs on first use, as they do for every policy.

Private vLLM interfaces touched (paths under ``vllm/``, vLLM 0.32.0):

- ``_custom_ops.py:3738`` ``create_onednn_mm(weight, primitive_cache_size)``: wrapped to raise the cache size;
  called from ``model_executor/layers/utils.py:594`` ``dispatch_cpu_unquantized_gemm`` with 32.
- ``v1/worker/cpu_worker.py:264`` ``CPUWorker.compile_or_warm_up_model``: wrapped, the warm-up runs after it.
- ``v1/worker/gpu_model_runner.py:5508`` ``GPUModelRunner._dummy_run(num_tokens, skip_eplb=...)`` (returns the
  hidden states and their last rows), ``.model.compute_logits``, ``.drafter.model``, ``.drafter.hidden_size``,
  ``.drafter.dtype``, ``.scheduler_config``, ``.speculative_config``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from specserve.replicas import vllm_hooks
from specserve.replicas.engine_log import engine_logger

logger = engine_logger(__name__)

# Row counts one weight shape's cache holds: every decode shape of 64 seats at k up to 4 (320), and prefill
# sizes beside them. Measured on perf pair S with 16 seats (80 row counts warmed): the engine process's resident
# memory 55 MB more (2,224 against 2,169 MB), its start-up 6 s longer.
PRIMITIVE_CACHE_SIZE = 512
# Set to 0 to start without the warm-up (and with vLLM's cache size), as ``lab/studies/shape_warmup/shape_warmup.py``
# does to compare.
ENV_SWITCH = "SPECSERVE_WARM_DECODE_SHAPES"

TARGETS = ("vllm._custom_ops:create_onednn_mm", "vllm.v1.worker.cpu_worker:CPUWorker.compile_or_warm_up_model")
# vLLM's functions, kept by ``install``.
_vllm_create_onednn_mm: Any = None
_vllm_compile_or_warm_up_model: Any = None


def warm_rows(max_num_seqs: int, max_k: int, token_budget: int) -> int:
    """The largest row count a decode step runs: every seat verifying max_k drafts, within the token budget."""
    return min(max_num_seqs * (max_k + 1), token_budget)


@torch.inference_mode()
def warm_decode_shapes(runner: Any) -> tuple[int, float]:
    """Run every decode row count once through the target and the draft; returns (row counts, seconds)."""
    sched = runner.scheduler_config
    spec = runner.speculative_config
    max_k = spec.num_speculative_tokens if spec is not None else 0
    rows = warm_rows(sched.max_num_seqs, max_k, sched.max_num_batched_tokens)
    started = time.perf_counter()
    for n in range(1, rows + 1):
        hidden, _ = runner._dummy_run(n, skip_eplb=True)
        runner.model.compute_logits(hidden)
    drafter: Any = getattr(runner, "drafter", None)
    draft_model = getattr(drafter, "model", None)
    if draft_model is not None:
        for n in range(1, min(sched.max_num_seqs, rows) + 1):  # the draft samples one row per request
            draft_model.compute_logits(torch.zeros(n, drafter.hidden_size, dtype=drafter.dtype))
    return rows, time.perf_counter() - started


def _create_onednn_mm(weight: torch.Tensor, primitive_cache_size: int = 128) -> Any:
    return _vllm_create_onednn_mm(weight, max(primitive_cache_size, PRIMITIVE_CACHE_SIZE))


def _compile_or_warm_up_model(self: Any) -> Any:
    out = _vllm_compile_or_warm_up_model(self)
    rows, seconds = warm_decode_shapes(self.model_runner)
    logger.info("specserve: warmed decode row counts 1-%d in %.1f s", rows, seconds)
    return out


def install() -> None:
    """Wrap vLLM's CPU GEMM cache size and CPU worker warm-up, once per process; nothing on other platforms.

    The switch stays an environment variable rather than a key of the engine's control config: the cache size is
    raised while the weights load, inside ``CPUWorker.load_model``, where the CPU worker holds no vLLM config in
    context (it never enters ``set_current_vllm_config``), and ``install`` itself runs when the worker resolves its
    extension, before the worker has its config."""
    global _vllm_create_onednn_mm, _vllm_compile_or_warm_up_model
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or os.environ.get(ENV_SWITCH, "1") == "0":
        return
    _vllm_create_onednn_mm = vllm_hooks.replace(TARGETS[0], _create_onednn_mm)
    _vllm_compile_or_warm_up_model = vllm_hooks.replace(TARGETS[1], _compile_or_warm_up_model)
