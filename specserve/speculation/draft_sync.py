"""When a k = 0 step may skip the draft's forward pass, and which requests' draft KV is complete.

A speculative vLLM engine normally runs the draft once per step even at k = 0, only to write the
draft's KV for the step's tokens. specserve skips that pass on k = 0 decode steps. The scheduler, which keeps
the draft's KV bookkeeping, decides each step's pass once (``plan_step``: whether it runs, by ``skips_draft_pass``,
and whom it catches up) and hands the worker, which runs (or skips) the draft, the frozen ``DraftPassPlan`` with
the step's ``SchedulerOutput``; the worker only applies it.

The draft pass writes KV at the positions of the target's scheduled tokens plus one extra slot, the
token sampled this step. One skipped step therefore leaves no hole (the previous pass already wrote
its position), but m consecutive skipped steps leave m - 1 positions whose draft KV is stale.
Drafting on top of stale KV is lossless but lowers acceptance silently, so a request whose draft KV has
a hole drafts nothing (``DraftKVTracker.lagging``) until the draft's KV is caught up: the next step that
runs the draft pass prepends the missed tokens to that request's part of the pass, as many lagging
requests as fit in the step's unused token budget and the catch-up cap (``catch_up_plan``), and from then on the request
drafts on a complete cache.

Prefix caching: a request whose first step starts at a prefix-cache hit reads KV blocks another request
filled, and their draft half may never have been written (that request's skipped passes, a draft offloaded
then, a reloaded draft's zeroed pages). The scheduler cannot tell, so a request entering the batch, new or
resumed after preemption, starts with no complete prefix (``DraftKVTracker.forget``): its lag is the whole
cached prefix, caught up by the step's pass like any other lag. That re-drafts every hit over its cached
tokens (a multiple of the KV block size), valid or not: lossless, and no draft on another request's holes.

Pure Python over plain numbers: no vllm, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# A CPU engine caps a step's catch-up (``catch_up_plan``'s ``max_tokens``) at this many tokens unless told
# otherwise: there a draft's pass over a token is dear beside a step (perf pair S in float32: about 0.2 ms a token,
# against 0.1-0.3 s decode steps of 16 requests). A GPU engine's draft pass over the budget is like one prefill
# chunk beside its target step, and stays bounded by the token budget alone.
CPU_CATCH_UP_MAX_TOKENS = 512


def skips_draft_pass(
    *,
    enabled: bool,
    k: int,
    num_new_requests: int,
    num_scheduled_tokens: Iterable[int],
    draft_resident: bool = True,
) -> bool:
    """Whether a step runs without the draft's forward pass.

    ``k`` is the step's ``num_spec_tokens_to_schedule``, ``num_new_requests`` the requests that enter
    the batch this step (new or resumed after preemption), ``num_scheduled_tokens`` the tokens each
    scheduled request computes. Only pure decode steps at k = 0 skip: every request computes exactly
    one token and none is new, so a prefill (or a recompute) always reaches the draft. An empty step
    runs no model at all and is not counted as skipped. While the draft's weights are offloaded
    (``draft_resident`` false) every step with tokens skips, prefills too: there is no draft to run.
    """
    if not draft_resident:
        return any(n > 0 for n in num_scheduled_tokens)
    if not enabled or k != 0 or num_new_requests != 0:
        return False
    seen = False
    for n in num_scheduled_tokens:
        if n != 1:
            return False
        seen = True
    return seen


def draft_pass_room(token_budget: int, num_scheduled_tokens: int, num_scheduled_requests: int) -> int:
    """Tokens a step's draft pass can take on top of its own: the draft's input buffers hold ``token_budget``
    (vLLM's ``max_num_batched_tokens``) and its first pass appends one slot per request to the scheduled tokens."""
    return max(token_budget - num_scheduled_tokens - num_scheduled_requests, 0)


def catch_up_plan(lags: Mapping[str, int], room: int, max_tokens: int | None = None) -> dict[str, int]:
    """Which lagging requests catch up in a step's draft pass, and over how many tokens each.

    ``lags`` maps each scheduled request to its lag (0: complete), ``room`` is what the draft pass's buffers
    hold beyond the step's own tokens (``draft_pass_room``). Shortest lag first
    (ties by id, so the worker and the scheduler pick alike whatever order they hold the batch in),
    while the total fits.

    ``max_tokens`` (None: no cap) bounds the pause a catch-up adds to the step, as a prefill chunk bounds a
    prompt's: every request in the batch waits for it. After a draft reload every request lags by its whole
    context (1,600-1,900 tokens over 16 requests on perf pair S), and caught up in one pass that step ran 2-5 x as
    long as the run's median step on the CPU. The cap is soft for the shortest lag, which is taken whole whenever
    the room holds it, so that no request waits for ever behind a cap smaller than its lag.

    A lag longer than the room (a context longer than the budget after a reload, or a k = 0 stretch that long)
    would never fit whole, so when the shortest lag does not fit it is caught up in part: its first
    ``min(room, max_tokens)`` missed positions (``is_partial``). That request's part of the pass is then the chunk
    alone, not the step's own tokens, which join its lag; it drafts nothing until the last chunk is in.
    """
    plan: dict[str, int] = {}
    total = 0
    lagging = sorted(((r, n) for r, n in lags.items() if n > 0), key=lambda item: (item[1], item[0]))
    for request_id, lag in lagging:
        if lag > room - total or (plan and max_tokens is not None and total + lag > max_tokens):
            break
        plan[request_id] = lag
        total += lag
    if lagging and not plan:
        chunk = room if max_tokens is None else min(room, max_tokens)
        if chunk > 0:
            plan[lagging[0][0]] = chunk
    return plan


def is_partial(plan: Mapping[str, int], lags: Mapping[str, int], request_id: str) -> bool:
    """Whether ``plan`` catches ``request_id`` up over only part of its lag."""
    return request_id in plan and plan[request_id] < lags.get(request_id, 0)


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

    def observe_step(
        self, skipped: bool, requests: Iterable[ScheduledRequest], caught_up: Mapping[str, int] | None = None
    ) -> None:
        """After a step: ``caught_up`` is the step's ``catch_up_plan``, the requests whose missed tokens its pass
        prepended and how many; one caught up in part has its complete prefix grown by its chunk only."""
        if skipped:
            return
        caught_up = caught_up or {}
        for r in requests:
            upto = self.draft_upto.get(r.request_id, 0)
            chunk = caught_up.get(r.request_id)
            if chunk is not None and chunk < r.start - upto:
                self.draft_upto[r.request_id] = upto + chunk
            elif chunk is not None or upto >= r.start:
                self.draft_upto[r.request_id] = r.num_computed_tokens + int(r.sampled)

    def forget(self, request_ids: Iterable[str]) -> None:
        """Requests entering the batch this step (new, or resumed after preemption): their complete prefix is empty.

        A request's first step may start past position 0 at a prefix-cache hit, on blocks whose draft half another
        request wrote or left stale, and a resumed request may hit blocks other than those its own passes wrote.
        Called before the step's lags are taken, its whole cached prefix then counts as lag."""
        for request_id in request_ids:
            self.draft_upto.pop(request_id, None)

    def lag(self, request_id: str, start: int) -> int:
        """Positions before ``start`` (a step's first) whose draft KV is stale: the catch-up's length."""
        return max(0, start - self.draft_upto.get(request_id, 0))

    def lagging(self, request_id: str, num_computed_tokens: int) -> bool:
        return self.draft_upto.get(request_id, 0) < num_computed_tokens

    def keep_only(self, live_request_ids: Iterable[str]) -> None:
        """Forget finished and aborted requests."""
        live = set(live_request_ids)
        for request_id in [r for r in self.draft_upto if r not in live]:
            del self.draft_upto[request_id]


@dataclass(frozen=True, slots=True)
class DraftPassPlan:
    """One step's draft pass as the scheduler decided it, for the worker to apply: whether the pass runs, and which
    requests it catches up, over how many missed tokens from which position. Frozen, so that every tensor-parallel
    rank applies the same plan; it crosses to the workers on the step's ``SchedulerOutput``."""

    skip: bool = False
    # Request -> missed tokens the pass prepends (``catch_up_plan``).
    catch_up: dict[str, int] = field(default_factory=dict)
    # Request -> its first stale position, for each request in ``catch_up``.
    first_stale: dict[str, int] = field(default_factory=dict)
    # The requests caught up over part of their lag (``is_partial``): the pass takes their chunk in place of their
    # step's tokens.
    partial: frozenset[str] = frozenset()


def plan_step(
    *,
    skip: bool,
    starts: Mapping[str, int],
    tracker: DraftKVTracker,
    room: int,
    max_tokens: int | None,
) -> DraftPassPlan:
    """The step's ``DraftPassPlan``: ``skip`` from ``skips_draft_pass``; ``starts`` each scheduled request's first
    position; ``tracker`` the draft KV before the step (requests entering the batch already forgotten); ``room`` from
    ``draft_pass_room``; ``max_tokens`` the catch-up cap."""
    if skip:
        return DraftPassPlan(skip=True)
    lags = {request_id: tracker.lag(request_id, start) for request_id, start in starts.items()}
    plan = catch_up_plan(lags, room, max_tokens)
    return DraftPassPlan(
        skip=False,
        catch_up=plan,
        first_stale={request_id: starts[request_id] - lags[request_id] for request_id in plan},
        partial=frozenset(request_id for request_id in plan if is_partial(plan, lags, request_id)),
    )
