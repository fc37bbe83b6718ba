"""When a k = 0 step may skip the draft's forward pass, and which requests' draft KV is complete.

A speculative vLLM engine normally runs the draft once per step even at k = 0, only to write the
draft's KV for the step's tokens. specserve skips that pass on k = 0 decode steps. Two processes must
then agree on which steps were skipped: the worker, which runs (or skips) the draft, and the
scheduler, which keeps the draft's KV bookkeeping. Both call ``skips_draft_pass`` on the same
numbers taken from the same ``SchedulerOutput``, so the rule exists once.

The draft pass writes KV at the positions of the target's scheduled tokens plus one extra slot, the
token sampled this step. One skipped step therefore leaves no hole (the previous pass already wrote
its position), but m consecutive skipped steps leave m - 1 positions whose draft KV is stale.
Drafting on top of stale KV is lossless but lowers acceptance silently, so until the draft's KV is
caught up (not implemented), a request whose draft KV has a hole drafts nothing
(``DraftKVTracker.lagging``). Requests that arrive later draft at once.

Pure Python over plain numbers: no vllm, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


def skips_draft_pass(*, enabled: bool, k: int, num_new_requests: int, num_scheduled_tokens: Iterable[int]) -> bool:
    """Whether a step runs without the draft's forward pass.

    ``k`` is the step's ``num_spec_tokens_to_schedule``, ``num_new_requests`` the requests that enter
    the batch this step (new or resumed after preemption), ``num_scheduled_tokens`` the tokens each
    scheduled request computes. Only pure decode steps at k = 0 skip: every request computes exactly
    one token and none is new, so a prefill (or a recompute) always reaches the draft. An empty step
    runs no model at all and is not counted as skipped.
    """
    if not enabled or k != 0 or num_new_requests != 0:
        return False
    seen = False
    for n in num_scheduled_tokens:
        if n != 1:
            return False
        seen = True
    return seen


@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    """One request's part in a finished step, as the scheduler sees it after the step."""

    request_id: str
    # First position the step computed (the request's computed tokens before the step).
    start: int
    # Computed tokens after the step, rejected drafts taken off: the position of the token sampled now.
    num_computed_tokens: int
    # Whether the step sampled a token for the request (false for a partial prefill chunk).
    sampled: bool


@dataclass(slots=True)
class DraftKVTracker:
    """Per request: the draft's KV is complete for positions ``[0, draft_upto)``.

    Updated after every step. A step that ran the draft pass extends the complete prefix when the
    step starts inside it (the pass wrote the step's tokens and, when one was sampled, its position);
    a skipped step extends nothing. A request is lagging once its computed tokens run past the
    complete prefix: its drafts would read stale draft KV.
    """

    draft_upto: dict[str, int] = field(default_factory=dict)

    def observe_step(self, skipped: bool, requests: Iterable[ScheduledRequest]) -> None:
        if skipped:
            return
        for r in requests:
            if self.draft_upto.get(r.request_id, 0) >= r.start:
                self.draft_upto[r.request_id] = r.num_computed_tokens + int(r.sampled)

    def lagging(self, request_id: str, num_computed_tokens: int) -> bool:
        return self.draft_upto.get(request_id, 0) < num_computed_tokens

    def keep_only(self, live_request_ids: Iterable[str]) -> None:
        """Forget finished and aborted requests."""
        live = set(live_request_ids)
        for request_id in [r for r in self.draft_upto if r not in live]:
            del self.draft_upto[request_id]
