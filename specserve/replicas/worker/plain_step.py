"""A step that skips the draft pass runs as a step of an engine without speculation (vLLM 0.32.0).

Skipping the draft's forward at k = 0 (``extension.py``) left a speculative engine's k = 0 step 4-6 % slower
than a plain engine's on perf pair S. Profiled, most of the rest was vLLM's speculative bookkeeping for a step
with no drafts: ``_prepare_inputs`` builds spec-decode metadata whenever the engine has a speculative config,
so the step samples through the rejection sampler (with zero drafts per request) instead of the plain sampler.
On a step the scheduler's plan skips (``signalled_drafts.step_plan``) and that verifies no draft, this module hides
the speculative config from ``_prepare_inputs`` for that one call: no metadata, logits at the last token of each
request, the plain sampler, and the plain output bookkeeping. The rest of the step is unchanged (the drafter's own
skip returns no drafts, and the scheduler does not fetch them).

Private vLLM interfaces touched (paths under ``vllm/``, vLLM 0.32.0):

- ``v1/worker/gpu_model_runner.py:1920`` ``GPUModelRunner._prepare_inputs(scheduler_output,
  num_scheduled_tokens)``: wrapped; it reads ``self.speculative_config`` once (2184) to choose between the
  plain and the spec-decode inputs, and returns ``spec_decode_metadata`` None on the plain branch, which
  ``_sample`` (4340) and ``_bookkeeping_sync`` (4947) handle as for an engine without speculation.
- ``GPUModelRunner.num_decode_draft_tokens`` (a CpuGpuBuffer, 2228-2230): set as the spec branch sets it for
  a step without drafts (0 for decode rows, -1 for prompt chunks), for the attention backends that read it:
  the state-space and linear-attention builders of hybrid models (2462-2478), so only where
  ``model_config.is_hybrid``.
- ``GPUModelRunner.input_batch.num_reqs`` / ``num_computed_tokens_cpu`` / ``num_prompt_tokens``.
- ``SchedulerOutput.scheduled_spec_decode_tokens`` and the plan's attribute (``signalled_drafts.PLAN_ATTR``).
- ``GPUModelRunner._build_attention_metadata`` (2249, called from ``execute_model`` right after
  ``_prepare_inputs``): wrapped; on a plain step it runs with ``attn_groups`` (a list per KV cache group of
  ``AttentionGroup``s with ``layer_names``) lacking the groups of the draft's layers, named by the proposer's
  ``_draft_attn_layer_names`` (``v1/spec_decode/llm_base_proposer.py:1335``).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import numpy as np
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from specserve.replicas import vllm_hooks
from specserve.replicas.k0_skip import runner_skips
from specserve.replicas.signalled_drafts import step_plan

# Steps that ran as plain steps on this worker (read by tests through the worker extension).
counts = {"plain_steps": 0}

TARGETS = (
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner._prepare_inputs",
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner._build_attention_metadata",
)
# vLLM's methods, kept by ``install``.
_original_prepare: Any = None
_original_build: Any = None
# Set by a plain step's ``_prepare_inputs``, read (and cleared) by the same step's attention metadata build.
_PLAIN_ATTR = "_specserve_plain_step"
_HYBRID_ATTR = "_specserve_hybrid_model"


def _prepare_plain_when_skipped(
    self: GPUModelRunner, scheduler_output: SchedulerOutput, num_scheduled_tokens: np.ndarray
) -> Any:
    plain = (
        runner_skips(self) and not scheduler_output.scheduled_spec_decode_tokens and step_plan(scheduler_output).skip
    )
    if not plain:
        return _original_prepare(self, scheduler_output, num_scheduled_tokens)
    speculative_config = self.speculative_config
    self.speculative_config = None
    try:
        result = _original_prepare(self, scheduler_output, num_scheduled_tokens)
    finally:
        self.speculative_config = speculative_config
    if _hybrid(self):
        num_reqs = self.input_batch.num_reqs
        decodes = (
            self.input_batch.num_computed_tokens_cpu[:num_reqs] >= self.input_batch.num_prompt_tokens[:num_reqs]
        ) & (num_scheduled_tokens[:num_reqs] == 1)
        self.num_decode_draft_tokens.np[:num_reqs] = np.where(decodes, 0, -1)
        self.num_decode_draft_tokens.np[num_reqs:].fill(-1)
        self.num_decode_draft_tokens.copy_to_gpu()
    counts["plain_steps"] += 1
    setattr(self, _PLAIN_ATTR, True)
    return result


def _hybrid(runner: GPUModelRunner) -> bool:
    # Only the state-space and linear-attention backends of hybrid models read num_decode_draft_tokens.
    hybrid = getattr(runner, _HYBRID_ATTR, None)
    if hybrid is None:
        hybrid = bool(runner.model_config.is_hybrid)
        setattr(runner, _HYBRID_ATTR, hybrid)
    return hybrid


def without_draft_only_groups(groups: list[list[Any]], draft_layers: Collection[str]) -> list[list[Any]]:
    """Each KV cache group's attention groups less those holding draft layers only. A draft whose layers match
    the target's (same backend and shapes) shares their group, which must stay: the target reads it."""
    draft = set(draft_layers)
    return [[g for g in gs if not draft.issuperset(g.layer_names)] for gs in groups]


def _build_without_draft_layers(self: GPUModelRunner, *args: Any, **kwargs: Any) -> Any:
    # Where the draft's layers sit in attention groups of their own, nothing reads their metadata on a plain
    # step, and building it was a few percent of a 2-3 ms CPU step. The flag is the step's only.
    if not getattr(self, _PLAIN_ATTR, False):
        return _original_build(self, *args, **kwargs)
    setattr(self, _PLAIN_ATTR, False)
    draft_layers = getattr(getattr(self, "drafter", None), "_draft_attn_layer_names", None)
    if not draft_layers:
        return _original_build(self, *args, **kwargs)
    groups = self.attn_groups
    self.attn_groups = without_draft_only_groups(groups, draft_layers)
    try:
        return _original_build(self, *args, **kwargs)
    finally:
        self.attn_groups = groups


def install() -> None:
    global _original_prepare, _original_build
    _original_prepare = vllm_hooks.replace(TARGETS[0], _prepare_plain_when_skipped)
    _original_build = vllm_hooks.replace(TARGETS[1], _build_without_draft_layers)
