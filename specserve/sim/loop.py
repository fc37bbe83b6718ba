"""The discrete-event loop over a set of replicas, run up to a time and resumed: the whole run in one process
(kernel.py), or one shard of the replicas between two sync points (parallel.py).

Its state (the event queue, which replicas are stepping, the router's set) lives on between calls to ``run``, so a
run cut into windows processes the very events, in the very order, of a run made in one call.
"""

from __future__ import annotations

from dataclasses import dataclass

from specserve.sim.draft_memory import DraftMemorySim
from specserve.sim.events import Event, EventQueue, Phase
from specserve.sim.feeds import ClosedLoop, OpenLoop, Sends
from specserve.sim.replica import Replica
from specserve.sim.routing import Router
from specserve.sim.scale_out import ScaleOut

Feed = OpenLoop | ClosedLoop


@dataclass(frozen=True, slots=True)
class TraceEntry:
    """One processed event, for the golden-trace test and debugging."""

    time_s: float
    phase: str
    replica: int
    request: int


class EventLoop:
    """Arrivals, steps and memory wake-ups in time order. With a router, an arrival goes where it routes; without
    one (a shard), an arrival carries the replica it was routed to elsewhere. A feed brings on arrivals (the whole
    run); a shard is handed them (``deliver``)."""

    def __init__(
        self,
        replicas: list[Replica],
        memory: DraftMemorySim | None,
        router: Router | None = None,
        feed: Feed | None = None,
        scale_out: ScaleOut | None = None,
        trace: list[TraceEntry] | None = None,
        max_trace_events: int = 0,
    ) -> None:
        self.replicas, self.memory, self.router, self.feed, self.scale_out = replicas, memory, router, feed, scale_out
        self.trace = trace if trace is not None else []
        self.max_trace_events = max_trace_events
        self.queue = EventQueue()
        self.busy = [False] * len(replicas)
        self.routed = replicas if scale_out is None else scale_out.serving
        # The time of the last event that is not a memory wake-up: a transfer finishing after the last step does not
        # lengthen the run.
        self.end_s = 0.0
        if scale_out is not None:
            self.queue.push(scale_out.cfg.at_s, Phase.JOIN)
        if feed is not None:
            self._send(feed.start())
            for change_s in feed.changes_s():
                self.queue.push(change_s, Phase.CLIENTS)

    def deliver(self, arrivals: list[tuple[float, int, int]]) -> None:
        """Arrivals routed elsewhere: (time, request, replica)."""
        for time_s, request, replica in arrivals:
            self.queue.push(time_s, Phase.ARRIVAL, replica=replica, request=request)

    def run(self, until_s: float = float("inf")) -> None:
        """Process every event before ``until_s``."""
        queue, memory, feed, trace = self.queue, self.memory, self.feed, self.trace
        while len(queue) and queue.next_s() < until_s:
            event = queue.pop()
            now_s = event.time_s
            if event.phase is Phase.MEMORY:
                for wake_s in memory.on_wake(now_s) if memory is not None else ():
                    queue.push(wake_s, Phase.MEMORY)
                continue
            if event.phase is Phase.JOIN:
                assert self.scale_out is not None
                self.routed = self.scale_out.join()
                continue
            self.end_s = now_s
            if len(trace) < self.max_trace_events:
                trace.append(TraceEntry(now_s, event.phase.name, event.replica, event.request))
            if event.phase is Phase.CLIENTS:
                assert feed is not None
                self._send(feed.on_change(now_s))
            elif event.phase is Phase.ARRIVAL:
                self._arrive(event, now_s)
            elif event.phase is Phase.STEP_START:
                self._start(self.replicas[event.replica], now_s)
            else:
                self._end(event, now_s)

    @property
    def idle(self) -> bool:
        return not len(self.queue)

    def _arrive(self, event: Event, now_s: float) -> None:
        if self.router is not None:
            replica = self.router.route(event.request, self.routed)
        else:
            replica = self.replicas[event.replica]
        replica.add(event.request)
        if self.feed is not None:
            self._send(self.feed.after_arrival(event.request))
        if not self.busy[replica.index]:
            self.busy[replica.index] = True
            self.queue.push(now_s, Phase.STEP_START, replica=replica.index)

    def _end(self, event: Event, now_s: float) -> None:
        replica, queue = self.replicas[event.replica], self.queue
        finished = replica.end_step(now_s)
        if self.feed is not None:
            self._send(self.feed.after_finish(finished, now_s))
        if self.memory is not None:
            for wake_s in self.memory.after_step(replica, now_s):
                queue.push(wake_s, Phase.MEMORY)
        if queue.first_after(now_s, Phase.STEP_START):
            # The next step's start would be the next event popped: start it without the round trip through the
            # heap (the events' order, and so the run, are the same).
            if len(self.trace) < self.max_trace_events:
                self.trace.append(TraceEntry(now_s, Phase.STEP_START.name, event.replica, 0))
            self._start(replica, now_s)
        else:
            queue.push(now_s, Phase.STEP_START, replica=event.replica)

    def _start(self, replica: Replica, now_s: float) -> None:
        duration_s = replica.start_step(now_s)
        if duration_s is None:
            self.busy[replica.index] = False
            if replica.waiting:
                raise RuntimeError(f"replica {replica.index} idle with {len(replica.waiting)} waiting")
        else:
            self.queue.push(now_s + duration_s, Phase.STEP_END, replica=replica.index)

    def _send(self, sends: Sends) -> None:
        for time_s, request in sends:
            self.queue.push(time_s, Phase.ARRIVAL, request=request)
