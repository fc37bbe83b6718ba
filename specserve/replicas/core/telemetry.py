"""Per-engine counters kept inside the EngineCore; ``StepCounters.snapshot()`` is the telemetry's
``SpeculationCounters`` (``specserve.messages``, where each counter's meaning is written).

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
from itertools import islice

from specserve.messages import AcceptanceEstimate, Counts, SpeculationCounters
from specserve.speculation import PositionAcceptance, StepRecord

#: Step durations kept for readers. Engines run tens to a few hundred steps a second, so this spans
#: more than ten seconds for a reader that polls every second; a reader further behind loses the
#: oldest durations, and memory stays bounded when nobody reads.
MAX_RECENT_DURATIONS = 4096


class StepCounters(Counts[SpeculationCounters]):
    """Cumulative per-engine counters, updated once per step inside the EngineCore: the fields of
    ``SpeculationCounters`` (declared and explained there only), counted as attributes where each event happens."""

    max_k: int
    # The latest steps' records, the last being step ``num_steps``: durations for the metrics, and the
    # step log a CPU latency profile is fitted from (lab/experiments/engine_check.py).
    recent_steps: deque[StepRecord]

    def __init__(self, max_k: int) -> None:
        super().__init__(SpeculationCounters)
        self.max_k = max_k
        self.recent_steps = deque(maxlen=MAX_RECENT_DURATIONS)
        self.num_steps_by_k = [0] * (max_k + 1)
        self.num_drafted_per_pos = [0] * max_k
        self.num_reached_per_pos = [0] * max_k
        self.num_accepted_per_pos = [0] * max_k

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


def acceptance_estimate(estimator: PositionAcceptance, max_k: int) -> AcceptanceEstimate:
    """The telemetry's acceptance estimator as a snapshot, over the engine's ``max_k`` positions (the estimator
    keeps at least one)."""
    return AcceptanceEstimate(
        per_pos=tuple(estimator.alphas())[:max_k],
        accepted_per_pos=tuple(estimator.accepted_counts())[:max_k],
        reached_per_pos=tuple(estimator.num_reached())[:max_k],
    )
