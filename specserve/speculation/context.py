"""The one place a ``StepContext`` is built, from plain numbers that the vLLM scheduler and the simulator
both know before a step is scheduled.

Both engines must announce the same load for the same state, or a policy tuned in the simulator meets
different numbers in production. The subtle number is the step's prefill: only waiting requests that free
seats can admit join this step, up to the token budget. Counting the whole queue tells a policy that an
offline batch at ``max_num_seqs`` prefills a full budget every step while it prefills nothing, and a policy
that prices prefill at the margin (``adaptive``) then finds drafts compute-bound and speculates too little.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice

import numpy as np
import numpy.typing as npt

from specserve.speculation.types import StepContext


def admissible_prefill_tokens(waiting_tokens: Iterable[int], num_free_seats: int, token_budget: int) -> int:
    """Tokens of the waiting requests, in queue order, that free seats could admit this step.

    ``waiting_tokens`` are the tokens each waiting request must compute on admission (its prompt, plus its
    outputs after a preemption that recomputes them); it is read lazily, so a long queue costs nothing.
    The sum stops growing once the budget is reached; the caller caps it at the budget.
    """
    total = 0
    for num_tokens in islice(waiting_tokens, max(num_free_seats, 0)):
        if total >= token_budget:
            break
        total += num_tokens
    return total


def most_kv_blocks_per_decode(block_size: int, max_k: int, lookahead_tokens: int = 0) -> int:
    """The new KV blocks one decode can need in a step at any k: it holds slots for its computed tokens, so it
    needs at most ceil((1 + max_k + lookahead) / block_size). Where the decodes times this fit the free blocks,
    every k fits and ``StepContext.kv_blocks_needed`` stays empty: the engine reads nothing per request."""
    if block_size <= 0:
        raise ValueError(f"block_size={block_size} must be positive")
    return -(-(1 + max_k + lookahead_tokens) // block_size)


def kv_blocks_needed(
    computed: npt.ArrayLike,
    blocks: npt.ArrayLike,
    drafts: npt.ArrayLike,
    *,
    block_size: int,
    max_k: int,
    lookahead_tokens: int = 0,
    max_model_len: int | None = None,
) -> tuple[int, ...]:
    """New KV blocks the decoding requests need this step at k = 0..max_k (``StepContext.kv_blocks_needed``).

    Per decoding request: its computed tokens, the KV blocks it holds, and the drafts it could verify this step
    (what the draft proposed for it last step where drafts are made a step ahead, as in vLLM; else any k). A
    decode at k computes 1 + min(k, its drafts) tokens and holds slots for them plus ``lookahead_tokens`` beyond
    (vLLM 0.32 reserves the draft's ``num_speculative_tokens`` there whatever k is), up to ``max_model_len``;
    what its blocks do not cover is allocated, and a step whose allocations exceed the free blocks preempts.
    """
    if block_size <= 0:
        raise ValueError(f"block_size={block_size} must be positive")
    computed_, blocks_, drafts_ = (np.asarray(column, dtype=np.int64)[:, None] for column in (computed, blocks, drafts))
    ks = np.arange(max_k + 1)[None, :]
    slots = computed_ + 1 + np.minimum(ks, drafts_) + lookahead_tokens
    if max_model_len is not None:
        slots = np.minimum(slots, max_model_len)
    needed = np.maximum(-(-slots // block_size) - blocks_, 0).sum(axis=0)
    return tuple(int(n) for n in needed)


def build_step_context(
    *,
    now_s: float,
    num_running: int,
    num_context_tokens: int,
    running_prefill_tokens: int,
    num_waiting: int,
    waiting_tokens: Iterable[int],
    max_num_seqs: int,
    token_budget: int,
    num_kv_blocks_free: int,
    num_kv_blocks_total: int,
    draft_resident: bool = True,
    request_ids: tuple[str, ...] = (),
    slo_tpot_s: float | None = None,
    kv_blocks_needed: tuple[int, ...] = (),
) -> StepContext:
    """The context for the next step.

    ``running_prefill_tokens``: prompt tokens the running requests have yet to compute (chunked prefill
    in progress). ``waiting_tokens``: per waiting request in admission order (``admissible_prefill_tokens``).
    ``token_budget``: tokens one step may schedule (vLLM's ``max_num_batched_tokens``).
    """
    admissible = admissible_prefill_tokens(waiting_tokens, max_num_seqs - num_running, token_budget)
    return StepContext(
        now_s=now_s,
        num_running=num_running,
        num_waiting=num_waiting,
        num_context_tokens=num_context_tokens,
        num_prefill_tokens=min(running_prefill_tokens + admissible, token_budget),
        num_kv_blocks_free=num_kv_blocks_free,
        num_kv_blocks_total=num_kv_blocks_total,
        draft_resident=draft_resident,
        request_ids=request_ids,
        slo_tpot_s=slo_tpot_s,
        kv_blocks_needed=kv_blocks_needed,
    )
