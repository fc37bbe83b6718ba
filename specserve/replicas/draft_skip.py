"""Worker side of "k = 0 is really off": skip the draft's forward pass on k = 0 decode steps (vLLM 0.32.0).

vLLM's drafter runs in the worker process(es), which the scheduler module cannot reach, so vLLM imports
this module there through ``worker_extension_cls`` (``engine_args.WORKER_EXTENSION_CLS``). Importing it
wraps ``GPUModelRunner.propose_draft_token_ids`` (``CPUModelRunner`` inherits it): when
``specserve.speculation.draft_sync.skips_draft_pass`` says so for the step's ``SchedulerOutput`` (the
scheduler evaluates the same function on the same output), the wrapper returns what the proposer
returns at k = 0, an empty ``(num_reqs, 0)`` int64 tensor, without running the draft. Every other step
goes to vLLM's method unchanged. Tensor-parallel ranks see the same ``SchedulerOutput``, so they skip
together and no collective is left waiting.

Private vLLM interfaces touched (paths under ``vllm/``, vLLM 0.32.0):

- ``v1/worker/gpu_model_runner.py:4748`` ``GPUModelRunner.propose_draft_token_ids(scheduler_output,
  sampled_token_ids, ...)``: wrapped; called from ``sample_tokens`` (4365) on the padded drafter path.
- ``GPUModelRunner._draft_probs`` / ``_draft_prob_req_ids``: reset to None on a skip, as the method does.
- ``GPUModelRunner.input_batch.req_ids``, ``.device``, ``.vllm_config``: read.
- ``SchedulerOutput`` and ``VllmConfig`` fields, read through ``k0_skip`` (listed there).
- ``v1/spec_decode/llm_base_proposer.py:620``: the k = 0 early return whose result a skip reproduces.
- ``v1/worker/worker_base.py:296``: ``worker_extension_cls`` is resolved (this module imported) in the worker.

What a skip leaves out besides the draft forward: ``prepare_next_token_ids_padded`` and
``_copy_valid_sampled_token_count``, which only matter under async scheduling (runner 938);
``k0_skip.skipping_enabled`` turns skipping off there.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from specserve.replicas.k0_skip import skipping_enabled, step_skips_draft_pass

# Per worker process: draft passes skipped and run, read by tests through ``collective_rpc``.
_counts = {"skipped": 0, "ran": 0}
_ENABLED_ATTR = "_specserve_skips_k0_draft_pass"


_original_propose = GPUModelRunner.propose_draft_token_ids


def _propose_or_skip(
    self: GPUModelRunner, scheduler_output: SchedulerOutput, *args: Any, **kwargs: Any
) -> list[list[int]] | torch.Tensor:
    enabled = getattr(self, _ENABLED_ATTR, None)
    if enabled is None:
        enabled = skipping_enabled(self.vllm_config)
        setattr(self, _ENABLED_ATTR, enabled)
    if not step_skips_draft_pass(enabled, scheduler_output):
        _counts["ran"] += 1
        return _original_propose(self, scheduler_output, *args, **kwargs)
    _counts["skipped"] += 1
    self._draft_probs = None
    self._draft_prob_req_ids = None
    return torch.empty((len(self.input_batch.req_ids), 0), dtype=torch.int64, device=self.device)


if getattr(_original_propose, "__name__", "") != _propose_or_skip.__name__:  # once per process
    GPUModelRunner.propose_draft_token_ids = _propose_or_skip


class DraftSkipWorkerExtension:
    """Mixed into vLLM's worker class; its methods are callable with ``collective_rpc``."""

    def specserve_draft_pass_counts(self) -> dict[str, int]:
        """Draft passes this worker skipped and ran (``propose_draft_token_ids`` calls) since it started."""
        return dict(_counts)
