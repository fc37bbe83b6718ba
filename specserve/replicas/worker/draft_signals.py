"""Worker side of draft confidences: what the draft thought of each token it drafted (vLLM 0.32.0).

AdaSpec's trimming and early stop and SpecKV's acceptance predictor read, per drafted position, the draft's
probability of the token it drafted (its confidence) and the entropy of its distribution. vLLM keeps the draft's
distribution only for probabilistic drafting (``_last_draft_probs``); greedy drafting takes an argmax of the
logits and drops them. This module wraps the proposer's per-pass sampler so that every pass also records, per
request, the softmax probability of the drafted token and the entropy in nats (from the same logits, computed
once), and hands them to the scheduler with the draft token ids: ``take_draft_token_ids`` returns a
``SignalledDraftTokenIds`` (``signalled_drafts.py``), a subclass that crosses the executor's process boundary as
the parent does (pickled, so the extra fields travel).

Private vLLM interfaces touched (paths under ``vllm/``, vLLM 0.32.0):

- ``v1/spec_decode/llm_base_proposer.py:479`` ``SpecDecodeBaseProposer._sample_draft_tokens(hidden_states,
  sampling_metadata)``: wrapped; called once per draft pass from ``propose`` (630, 651, 762). Its greedy branch
  (``_greedy_sample``, 439) is ``compute_logits(...).argmax(-1)``, which the wrapper reproduces with the logits
  kept; the local-argmax and heterogeneous-vocabulary variants keep vLLM's method and record nothing.
- ``SpecDecodeBaseProposer._enable_probabilistic_draft_probs``, ``use_local_argmax_reduction``,
  ``use_heterogeneous_vocab``, ``parallel_drafting``, ``num_speculative_tokens``, ``model.compute_logits``: read.
- ``GPUModelRunner.drafter``, ``input_batch.req_ids``, ``vllm_config.additional_config``: read.
- ``v1/worker/gpu_model_runner.py:4627`` ``GPUModelRunner.take_draft_token_ids``: wrapped; its
  ``DraftTokenIds(req_ids, draft_token_ids)`` (``v1/outputs.py:367``) is extended, not changed.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.outputs import DraftTokenIds
from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from specserve.replicas import vllm_hooks
from specserve.replicas.config.engine_args import ADDITIONAL_CONFIG_KEY, EngineControlConfig
from specserve.replicas.signalled_drafts import SignalledDraftTokenIds

TARGETS = (
    "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer._sample_draft_tokens",
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner.take_draft_token_ids",
)

# On the proposer: this propose call's passes, each a (confidence, entropy) pair of [rows] tensors.
_PASSES_ATTR = "_specserve_pass_signals"
# On the runner: whether this engine computes signals (``EngineControlConfig.draft_signals``), read once.
_WANTED_ATTR = "_specserve_draft_signals_wanted"
# On the runner: the last propose call's signals, (req_ids, confidence, entropy) with [num_reqs, passes] tensors.
_SIGNALS_ATTR = "_specserve_draft_signals"


def begin(runner: GPUModelRunner) -> None:
    """A propose call starts: its passes record into a fresh list (where the engine was asked for signals)."""
    setattr(runner, _SIGNALS_ATTR, None)
    drafter = getattr(runner, "drafter", None)
    if isinstance(drafter, SpecDecodeBaseProposer) and _wanted(runner):
        setattr(drafter, _PASSES_ATTR, [])


def _wanted(runner: GPUModelRunner) -> bool:
    wanted = getattr(runner, _WANTED_ATTR, None)
    if wanted is None:
        data = (runner.vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
        wanted = bool(data) and EngineControlConfig.from_additional_config(data).draft_signals
        setattr(runner, _WANTED_ATTR, wanted)
    return wanted


def end(runner: GPUModelRunner) -> None:
    """The propose call ran: keep its passes' signals, one row per request of the input batch."""
    drafter = getattr(runner, "drafter", None)
    passes = getattr(drafter, _PASSES_ATTR, None)
    if drafter is not None:
        setattr(drafter, _PASSES_ATTR, None)
    req_ids = list(runner.input_batch.req_ids)
    if drafter is None or not passes or not req_ids:
        return
    num_reqs = len(req_ids)
    # A sequential pass gives a row per request (the first num_reqs; rows after them are batch padding); a
    # parallel drafter's one pass gives k rows per request, request-major.
    width = int(drafter.num_speculative_tokens) if getattr(drafter, "parallel_drafting", False) else 1
    try:
        confidence = torch.cat([c[: num_reqs * width].view(num_reqs, width) for c, _ in passes], 1)
        entropy = torch.cat([e[: num_reqs * width].view(num_reqs, width) for _, e in passes], 1)
    except RuntimeError:  # a shape this reading does not know: no signals rather than wrong ones
        return
    setattr(runner, _SIGNALS_ATTR, (req_ids, confidence, entropy))


def clear(runner: GPUModelRunner) -> None:
    """A step that drafted nothing (k = 0 skipped the pass): no signals for it."""
    setattr(runner, _SIGNALS_ATTR, None)


def _signals(log_probs: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the probability of the drafted token, and the distribution's entropy in nats."""
    confidence = log_probs.gather(-1, token_ids.view(-1, 1).long()).squeeze(-1).exp()
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return confidence, entropy


# vLLM's methods, kept by ``install``.
_original_sample: Any = None
_original_take: Any = None


def _sample_with_signals(self: SpecDecodeBaseProposer, hidden_states: torch.Tensor, sampling_metadata: Any) -> Any:
    passes = getattr(self, _PASSES_ATTR, None)
    if passes is None or self.use_local_argmax_reduction or self.use_heterogeneous_vocab:
        return _original_sample(self, hidden_states, sampling_metadata)
    if not self._enable_probabilistic_draft_probs or sampling_metadata.all_greedy:
        # vLLM's greedy branch, with the logits kept for the signals.
        logits = self.model.compute_logits(hidden_states)
        token_ids = logits.argmax(dim=-1)
        passes.append(_signals(torch.log_softmax(logits.float(), dim=-1), token_ids))
        return token_ids, None
    token_ids, probs = _original_sample(self, hidden_states, sampling_metadata)
    if probs is not None:
        passes.append(_signals(probs.float().clamp_min(1e-30).log(), token_ids))
    return token_ids, probs


def _take_with_signals(self: GPUModelRunner) -> DraftTokenIds | None:
    taken = _original_take(self)
    signals = getattr(self, _SIGNALS_ATTR, None)
    if taken is None or signals is None:
        return taken
    req_ids, confidence, entropy = signals
    if list(taken.req_ids) != req_ids:
        return taken
    width = max((len(ids) for ids in taken.draft_token_ids), default=0)
    return SignalledDraftTokenIds(
        req_ids=taken.req_ids,
        draft_token_ids=taken.draft_token_ids,
        confidences=confidence[:, :width].tolist(),
        entropies=entropy[:, :width].tolist(),
    )


def install() -> None:
    global _original_sample, _original_take
    _original_sample = vllm_hooks.replace(TARGETS[0], _sample_with_signals)
    _original_take = vllm_hooks.replace(TARGETS[1], _take_with_signals)
