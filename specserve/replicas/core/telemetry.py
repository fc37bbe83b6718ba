"""Per-engine counters kept inside the EngineCore, read into ``specserve.messages.EngineTelemetry``.

A read is pure: everything here is cumulative, so two readers (the replica's telemetry loop, a test,
a future exporter) never take anything from each other.

Step durations: the engine keeps the most recent ones in a ring buffer, and a reader asks for those
after the step count it has already exported (its cursor). Two other designs were rejected:
draining a pending list on read made reads steal each other's durations; cumulative bucket counts
in the engine would be pure too, but ``ray.util.metrics.Histogram`` accepts only ``observe(value)``,
so bucket deltas could only be replayed as made-up values and the exported ``_sum`` would be wrong.
The ring buffer replays the exact durations, and at the replica's one read a second it never wraps.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import islice

from specserve.speculation import StepRecord

#: Step durations kept for readers. Engines run tens to a few hundred steps a second, so this spans
#: more than ten seconds for a reader that polls every second; a reader further behind loses the
#: oldest durations, and memory stays bounded when nobody reads.
MAX_RECENT_DURATIONS = 4096


@dataclass(slots=True)
class StepCounters:
    """Cumulative per-engine counters, updated once per step inside the EngineCore."""

    max_k: int
    num_steps: int = 0
    num_emitted_tokens: int = 0
    num_steps_by_k: list[int] = field(default_factory=list)
    num_drafted_per_pos: list[int] = field(default_factory=list)
    num_reached_per_pos: list[int] = field(default_factory=list)
    num_accepted_per_pos: list[int] = field(default_factory=list)
    # Sum over steps of the prefill tokens the step's context announced to the policy.
    num_prefill_tokens_announced: int = 0
    # Draft lists cut shorter than the step's k by the policy's per-request caps.
    num_drafts_capped: int = 0
    # k = 0 decode steps whose draft forward pass the worker skipped (``k0_skip``).
    num_steps_draft_skipped: int = 0
    # Draft lists cut to nothing because the request's draft KV has a hole (the lag rule).
    num_drafts_cut_for_lag: int = 0
    # Draft lists cut before verification to their confident prefix (the policy's draft_stop on confidences).
    num_drafts_cut_by_confidence: int = 0
    # Draft lists the scheduler received from the worker (one per request per drafting step), and those that came
    # with the draft's confidences: the start-up check ``draft_signals`` reads them.
    num_draft_lists: int = 0
    num_draft_lists_with_signals: int = 0
    # Requests whose missed tokens a draft pass prepended, and those tokens (the catch-up's cost).
    num_requests_caught_up: int = 0
    num_catch_up_tokens: int = 0
    # Seconds spent inside the policy's choose and observe, summed over steps: the controller's own cost.
    policy_s: float = 0.0
    # Their CPU seconds on the EngineCore's thread (``time.thread_time``).
    policy_cpu_s: float = 0.0
    # The latest steps' records, the last being step ``num_steps``: durations for the metrics, and the
    # step log a CPU latency profile is fitted from (lab/experiments/engine_check.py).
    recent_steps: deque[StepRecord] = field(default_factory=lambda: deque(maxlen=MAX_RECENT_DURATIONS))

    def __post_init__(self) -> None:
        self.num_steps_by_k = [0] * (self.max_k + 1)
        self.num_drafted_per_pos = [0] * self.max_k
        self.num_reached_per_pos = [0] * self.max_k
        self.num_accepted_per_pos = [0] * self.max_k

    def add(self, record: StepRecord) -> None:
        self.num_steps += 1
        self.num_emitted_tokens += record.num_emitted_tokens
        self.num_steps_by_k[min(record.k, self.max_k)] += 1
        if record.num_drafted_per_request:  # a step that verified no draft adds nothing per position
            drafted, reached, accepted = record.per_position(self.max_k)
            for pos in range(self.max_k):
                self.num_drafted_per_pos[pos] += drafted[pos]
                self.num_reached_per_pos[pos] += reached[pos]
                self.num_accepted_per_pos[pos] += accepted[pos]
        self.recent_steps.append(record)

    def records_since(self, step: int) -> tuple[StepRecord, ...]:
        """Records of the steps after ``step`` (a step count the reader has seen), oldest first, as far
        as the buffer reaches back. Reads only."""
        kept = len(self.recent_steps)
        wanted = min(max(0, self.num_steps - step), kept)
        return tuple(islice(self.recent_steps, kept - wanted, None))

    def durations_since(self, step: int) -> tuple[float, ...]:
        return tuple(r.duration_s for r in self.records_since(step))
