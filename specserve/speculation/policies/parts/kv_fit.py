"""Speculation that does not preempt: the largest k whose KV slots fit the free blocks.

A decode at k needs KV slots for 1 + k tokens this step (and, in vLLM, lookahead slots beyond them). When the
pool is nearly full, a k whose new blocks exceed the free ones makes the scheduler preempt a running request,
which drops its KV and recomputes its whole context later: far more than the drafts' gain in one step. The
engine counts the blocks each k needs (``StepContext.kv_blocks_needed``; exact, from each decode's held blocks),
so the rule needs no estimate. It never asks for more blocks than k = 0 would unless they fit: where not even
k = 0 fits, the step preempts whatever k is, and a k that adds no blocks to k = 0's preempts no more.
"""

from __future__ import annotations

from specserve.speculation.types import StepContext


def largest_fitting_k(ctx: StepContext, k: int) -> int:
    """The largest k' <= ``k`` whose new KV blocks fit ``ctx.num_kv_blocks_free`` (or k = 0's need, where that
    is larger); ``k`` where the engine reports no need (every k fits)."""
    needed = ctx.kv_blocks_needed
    if not needed or k <= 0:
        return k
    room = max(ctx.num_kv_blocks_free, needed[0])
    k = min(k, len(needed) - 1)
    while k > 0 and needed[k] > room:
        k -= 1
    return k
