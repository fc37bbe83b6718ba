"""A static batch-size -> k schedule: vLLM's Dynamic SD and TensorRT-LLM's draft-length schedule.

vLLM PR #32374 ("[V1][Spec Decode] Add Dynamic SD", merged) adds ``num_speculative_tokens_per_batch_size``, a
table of ``[first, last, k]`` ranges fixed at startup; the example in vLLM's Dynamic SD docs is
``[[1,16,5],[17,32,4],[33,64,3],[65,128,1],[129,512,0]]``, our default. TensorRT-LLM PR #10860's
``draft_len_schedule = {4:4, 8:2, 32:1}`` is the same idea (batch 33+ gets 0). Neither ships a
default table: the right one depends on the hardware and model, and is profiled offline.

In a policy spec the table is written ``first-last:k`` ranges joined by ``/`` (``,`` and ``=`` end a
parameter), e.g. ``static-table:table=1-8:4/9-32:2/33-64:1``.
"""

from __future__ import annotations

from dataclasses import dataclass

from specserve.speculation.policy import Policy, register
from specserve.speculation.types import Decision, EngineTraits, StepContext

# The example in vLLM's Dynamic SD docs, in this module's syntax.
DEFAULT_TABLE = "1-16:5/17-32:4/33-64:3/65-128:1/129-512:0"


@dataclass(frozen=True, slots=True)
class BatchRange:
    """Batch sizes first..last (inclusive) speculate k."""

    first: int
    last: int
    k: int


def parse_table(text: str) -> tuple[BatchRange, ...]:
    """Parse ``first-last:k/...``: ranges must start at 1, ascend and leave no gap or overlap.

    Contiguity is required, not just non-overlap: a gap would need a k nobody wrote down.
    Errors name the offending part.
    """
    ranges: list[BatchRange] = []
    for part in text.split("/"):
        span, sep, k_text = part.strip().partition(":")
        first_text, dash, last_text = span.partition("-")
        try:
            if not sep or not dash:
                raise ValueError
            entry = BatchRange(int(first_text), int(last_text), int(k_text))
        except ValueError:
            raise ValueError(f"table entry {part.strip()!r} is not first-last:k") from None
        if entry.first < 1 or entry.last < entry.first or entry.k < 0:
            raise ValueError(f"table entry {part.strip()!r} needs 1 <= first <= last and k >= 0")
        expected_first = ranges[-1].last + 1 if ranges else 1
        if entry.first != expected_first:
            what = "start at batch size 1" if not ranges else f"continue at {expected_first} (gap or overlap)"
            raise ValueError(f"table entry {part.strip()!r} must {what}")
        ranges.append(entry)
    return tuple(ranges)


@dataclass(frozen=True, slots=True)
class StaticTableParams:
    # Batch-size ranges and their k, "first-last:k" joined by "/"; batch sizes past the last range get 0.
    table: str = DEFAULT_TABLE

    def __post_init__(self) -> None:
        try:
            parse_table(self.table)
        except ValueError as exc:
            raise ValueError(f"table={self.table!r}: {exc}") from None


@register
class StaticTablePolicy(Policy):
    """k from the current batch size by table lookup; no learning.

    Batch sizes beyond the table get k = 0, as TensorRT-LLM's schedule does (33+ -> 0 in its example):
    the table's k falls with batch size because verification cost grows with B * k (vLLM's DSD PR:
    past a "critical BS" speculation hurts TPOT), and nobody profiled the larger batches, so no
    speculation is the safe answer there. vLLM's own example ends in a 0 range anyway.
    Entries above the engine's max_k are capped to it: the engine cannot verify more.
    """

    name = "static-table"
    Params = StaticTableParams

    def __init__(self, params: StaticTableParams, traits: EngineTraits) -> None:
        super().__init__(params, traits)
        self.ranges = parse_table(params.table)
        # k per batch size, index = batch size (0 unused): a list index is the whole per-step cost.
        self._k_by_batch = [0] * (self.ranges[-1].last + 1)
        for entry in self.ranges:
            for batch in range(entry.first, entry.last + 1):
                self._k_by_batch[batch] = min(entry.k, traits.max_k)

    def choose(self, ctx: StepContext) -> Decision:
        if not ctx.draft_resident:
            return Decision(k=0)
        return Decision(k=self.k_for(ctx.num_running))

    def k_for(self, num_running: int) -> int:
        """The table's k for a batch size, capped at max_k; 0 outside the table (and for B = 0)."""
        if 0 < num_running < len(self._k_by_batch):
            return self._k_by_batch[num_running]
        return 0
