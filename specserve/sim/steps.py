"""What one simulated step reports: the policy's StepRecord, the simulator's StepStats beside it, and the draft
passes a step runs.

The replica (replica.py) schedules and prices a step; these are the pure pieces it builds from the step's
drafts, kept apart so that the replica holds the scheduling and nothing of the record's layout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from specserve.sim.drafting import Drafts, ragged
from specserve.speculation import StepRecord


@dataclass(frozen=True, slots=True)
class StepStats:
    """What the simulator knows about a step beyond the policy's StepRecord (for tests and plots)."""

    replica: int
    # Requests that sampled tokens this step (decodes, and prefills that completed their prompt).
    num_sampled: int
    num_preempted: int
    # Requests still waiting once this step was scheduled: the seats, KV or token budget had no room for them.
    num_waiting: int
    num_finished: int
    num_kv_blocks_used: int
    num_kv_blocks_total: int


StepListener = Callable[[StepRecord, StepStats], None]


def further_pass_tokens(drafts: Drafts | None, num_passes: int) -> list[int]:
    """Pass j >= 2 proposes one token for each request that drafts at least j tokens."""
    if drafts is None:
        return []
    if drafts.fewest == num_passes:
        return [len(drafts.drafted)] * (num_passes - 1)
    return (drafts.drafted[:, None] >= np.arange(2, num_passes + 1)).sum(axis=0).tolist()


def step_record(
    now_s: float,
    k: int,
    duration_s: float,
    scheduled: np.ndarray,
    num_context: int,
    num_batched: int,
    num_passes: int,
    num_emitted: int,
    request_ids: tuple[str, ...],
    drafts: Drafts | None,
    parts: tuple[float, float] | None = None,
) -> StepRecord:
    """The record the policy observes; ``request_ids`` and ``drafts`` are aligned with the drafting rows; ``parts``:
    the step's (target pass, draft passes) seconds, as the engine times them."""
    drafted: tuple[int, ...] = ()
    accepted: tuple[int, ...] = ()
    confidence: tuple[tuple[float, ...], ...] = ()
    entropy: tuple[tuple[float, ...], ...] = ()
    kl: tuple[tuple[float, ...], ...] = ()
    if drafts is not None:
        drafted, accepted = tuple(drafts.drafted.tolist()), tuple(drafts.accepted.tolist())
        if drafts.signals is not None:
            uniform = num_passes == drafts.fewest
            confidence = ragged(drafts.signals.confidence, drafts.drafted, uniform)
            entropy = ragged(drafts.signals.entropy_nats, drafts.drafted, uniform)
            kl = ragged(drafts.signals.kl_nats, drafts.drafted, uniform)
    return StepRecord(
        now_s=now_s,
        k=k,
        duration_s=duration_s,
        num_running=int(np.count_nonzero(scheduled)),
        num_context_tokens=num_context,
        num_batched_tokens=num_batched,
        num_draft_passes=num_passes,
        # Sampler output, as vLLM counts it: tokens past a request's max_tokens are dropped later.
        num_emitted_tokens=num_emitted,
        num_drafted_per_request=drafted,
        num_accepted_per_request=accepted,
        request_ids=request_ids,
        draft_confidence_per_request=confidence,
        draft_entropy_per_request=entropy,
        kl_per_request=kl,
        forward_s=parts[0] if parts is not None else None,
        draft_s=parts[1] if parts is not None else None,
    )
