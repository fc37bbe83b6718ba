"""Simulator events: records in one heap, ordered by ``(time_s, phase, seq)`` (house rule 9).

The order is defined here and nowhere else. At equal times a step that ends goes first (its tokens
and freed KV blocks are visible to everything after it), then a closed loop's change in its number of clients
(feeds.py; the clients it starts send at once), then arrivals (so a request arriving at the
instant a step ends joins the next step), then step starts, then the draft memory's wake-ups (a transfer or a
pool change finishing; draft_memory.py), which only scenarios with draft offload have, then replicas joining
(a scale-out). ``seq`` is a per-run
counter: ties in time and phase resolve by insertion order, so a run is deterministic without comparing payloads.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from enum import IntEnum


class Phase(IntEnum):
    STEP_END = 0
    CLIENTS = 1
    ARRIVAL = 2
    STEP_START = 3
    MEMORY = 4
    # Replicas joining the router (scale_out); last at equal times, so the earlier phases kept their order.
    JOIN = 5


@dataclass(frozen=True, slots=True)
class Event:
    time_s: float
    phase: Phase
    # Insertion counter; unique per run, so two events never compare equal.
    seq: int
    # Replica a step event belongs to; arrivals and memory wake-ups leave it 0 (the router picks a replica on
    # arrival; draft_memory.py knows what is due).
    replica: int = 0
    # Index of the request in the run's workload, for arrivals.
    request: int = 0


class EventQueue:
    """A heap of events; the simulator owns one per run (no global queue)."""

    def __init__(self) -> None:
        # (time_s, phase, seq, event): tuples compare in C, and seq is unique so the event itself is
        # never compared.
        self._heap: list[tuple[float, int, int, Event]] = []
        self._seq = 0

    def push(self, time_s: float, phase: Phase, replica: int = 0, request: int = 0) -> Event:
        event = Event(time_s, phase, self._seq, replica, request)
        self._seq += 1
        heapq.heappush(self._heap, (time_s, int(phase), event.seq, event))
        return event

    def first_after(self, time_s: float, phase: Phase) -> bool:
        """Whether an event pushed now at ``time_s`` and ``phase`` would be the next one popped: every queued event
        comes later (a later time, or the same time and a later phase; a pushed event's seq is the largest)."""
        if not self._heap:
            return True
        head_s, head_phase = self._heap[0][0], self._heap[0][1]
        return head_s > time_s or (head_s == time_s and head_phase > phase)

    def next_s(self) -> float:
        """The time of the next event (the queue must not be empty)."""
        return self._heap[0][0]

    def pop(self) -> Event:
        return heapq.heappop(self._heap)[3]

    def __len__(self) -> int:
        return len(self._heap)
