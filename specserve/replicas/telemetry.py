"""Telemetry that leaves the engine: counters kept in the EngineCore, and the snapshots built from them.

``EngineTelemetry`` crosses EngineCore -> replica (as a dict through vLLM's utility call, which
serialises with msgpack); ``ReplicaSnapshot`` crosses replica -> controller (through Ray). Neither
module imports vLLM, so the controller and the CLI can use them without it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from specserve.speculation import StepRecord

#: Step durations kept between two snapshots; beyond this the oldest are dropped (the histogram
#: then under-counts, which is better than unbounded memory if nobody reads telemetry).
MAX_PENDING_DURATIONS = 4096


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
    # Steps whose decision carried per-request caps that the engine did not apply.
    num_steps_caps_ignored: int = 0
    pending_durations_s: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.num_steps_by_k = [0] * (self.max_k + 1)
        self.num_drafted_per_pos = [0] * self.max_k
        self.num_reached_per_pos = [0] * self.max_k
        self.num_accepted_per_pos = [0] * self.max_k

    def add(self, record: StepRecord) -> None:
        self.num_steps += 1
        self.num_emitted_tokens += record.num_emitted_tokens
        self.num_steps_by_k[min(record.k, self.max_k)] += 1
        drafted, reached, accepted = record.per_position(self.max_k)
        for pos in range(self.max_k):
            self.num_drafted_per_pos[pos] += drafted[pos]
            self.num_reached_per_pos[pos] += reached[pos]
            self.num_accepted_per_pos[pos] += accepted[pos]
        if len(self.pending_durations_s) < MAX_PENDING_DURATIONS:
            self.pending_durations_s.append(record.duration_s)

    def drain_durations(self) -> list[float]:
        durations, self.pending_durations_s = self.pending_durations_s, []
        return durations


@dataclass(frozen=True, slots=True)
class EngineTelemetry:
    """One read of an engine's state, taken between two steps."""

    pid: int
    # Canonical spec of the running policy, e.g. "goodput:k_max=4,...".
    policy: str
    # The k chosen for the most recent step.
    k: int
    max_k: int
    num_running: int
    num_waiting: int
    num_kv_blocks_total: int
    num_kv_blocks_free: int
    # "resident" until the draft-offload work lands; the field exists so dashboards need no change.
    draft_state: str
    num_steps: int
    num_emitted_tokens: int
    num_steps_by_k: tuple[int, ...]
    num_drafted_per_pos: tuple[int, ...]
    num_reached_per_pos: tuple[int, ...]
    num_accepted_per_pos: tuple[int, ...]
    # Exponentially weighted conditional acceptance per position (same estimator for every policy).
    acceptance_ema_per_pos: tuple[float, ...]
    # Durations of the steps since the previous read, for the latency histogram.
    step_durations_s: tuple[float, ...]
    # Whatever the policy reports about itself (estimates, fitted model).
    policy_info: dict[str, float]
    # Prefill tokens the step contexts announced to the policy, summed over steps: a check that the
    # policy sees the load the scheduler will really run.
    num_prefill_tokens_announced: int = 0
    # Steps whose policy asked for per-request caps the engine does not apply yet (batch-wide k only).
    num_steps_caps_ignored: int = 0

    @property
    def acceptance(self) -> float | None:
        """Position-0 EMA acceptance, the headline number operators compare with papers; None until a
        draft has been verified (the estimator's prior is not a measurement)."""
        if not self.num_reached_per_pos or self.num_reached_per_pos[0] == 0:
            return None
        return self.acceptance_ema_per_pos[0]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineTelemetry:
        return cls(**{f.name: _freeze(data[f.name]) for f in dataclasses.fields(cls)})


@dataclass(frozen=True, slots=True)
class ReplicaSnapshot:
    """What a replica pushes to the controller about once a second."""

    replica_id: str
    node_id: str
    model_id: str
    # Wall-clock time (time.time()) the snapshot was taken; the controller ages replicas out by it.
    time_s: float
    engine: EngineTelemetry


def _freeze(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value
