"""Replicas stepped in parallel processes between sync points (``workers`` > 1): a cluster's run on several cores.

The replicas are cut into shards, whole nodes each (a node's replicas share one host link), one shard per process;
the first is stepped by the calling process, the others by processes forked from it once the run is built. Time is
cut into windows of ``sync_s`` simulated seconds. At each window's start the coordinator routes the window's
arrivals, and each shard then runs its replicas' events up to the window's end on its own, in the order of a
one-process run. Between windows the shards report what the router and the planner read, and the planner's decisions
go back.

What this changes from a one-process run:
- The router reads each replica's outstanding requests as of the window's start, plus the requests it has sent
  there since, less the finishes of the step each replica had in flight once that step's end has passed (a step's
  finishes are known when it starts: its verdicts are drawn then). A step that both starts and ends within one window
  is seen at the next sync point. So with ``sync_s`` shorter than every step the router sees what it would in one
  process, and a run without draft memory is the one-process run to the byte (tests/sim/test_sim_parallel.py).
- Draft offload and reload are granted at the sync points, over every shard's replicas, where a one-process run
  grants a want at the step that raised it. Neither is the product's timing: a replica's want reaches the cluster
  controller with its next telemetry push (once a second) and the answer comes back with it.
Otherwise every replica sees what it would: each draws from its own random streams, so a shard's replicas step
as they would in one process given the same arrivals. A run is deterministic for a given ``workers`` and
``sync_s``; how far its statistics are from a one-process run's, beside the noise from seed to seed, is what
``bench/sim_parallel.py`` measures.
A one-process run (``workers`` = 1) does not pass through here.

Needs the fork start method (Linux, macOS with care): the forked processes inherit the built run, so nothing but
the arrivals and the reports crosses between processes until the end, when each shard sends its replicas back.
"""

from __future__ import annotations

import heapq
import math
import multiprocessing
import traceback
import warnings
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from specserve.messages import MemoryDecision
from specserve.sim.batch import RequestTable
from specserve.sim.config import ClientsArrivals, Scenario
from specserve.sim.draft_memory import DraftMemorySim, MemoryState
from specserve.sim.feeds import OpenLoop
from specserve.sim.loop import EventLoop
from specserve.sim.replica import Replica
from specserve.sim.routing import Router

# A sync point every 20 ms of simulated time: about the shortest step of a 7B model on one GPU, below which the
# router's view is exact, and far sooner than the controller's answer to a replica's next push (once a second).
DEFAULT_SYNC_S = 0.02

Arrival = tuple[float, int, int]  # (time, request, replica)
# Outstanding requests, draft resident, pool expanded, and the in-flight step's end and finishes (None: no step).
Routed = tuple[int, bool, bool, tuple[float, int] | None]
Decisions = list[tuple[int, MemoryDecision]]


@dataclass(slots=True)
class _View:
    """What the router reads of a replica (routing.RoutedReplica), as of the last sync point."""

    index: int
    num_outstanding: int
    draft_resident: bool
    kv_expanded: bool


@dataclass(frozen=True, slots=True)
class _Report:
    """A shard's state at a sync point."""

    routed: list[tuple[int, Routed]]  # replicas whose routed state changed since the last report
    memory: list[tuple[int, MemoryState]]  # replicas whose planner's view changed (none without a planner)
    plan_due: bool
    next_s: float  # the shard's next event (inf: none)
    end_s: float


def num_nodes(num_replicas: int, replicas_per_node: int) -> int:
    """Nodes of ``replicas_per_node`` replicas each, the last one maybe partly filled (replica i is on node
    i // replicas_per_node, as draft_memory.py places it)."""
    return -(-num_replicas // replicas_per_node)


def parallel_refusal(scenario: Scenario, workers: int, sync_s: float, listens: bool = False) -> str | None:
    """Why ``scenario`` cannot run on ``workers`` processes synced every ``sync_s`` (None: it can). ``listens``: the
    run has a step listener or keeps an event trace, which see one process's steps."""
    nodes = num_nodes(scenario.num_replicas, scenario.memory.replicas_per_node)
    if workers < 1 or workers > nodes:
        per_node = scenario.memory.replicas_per_node
        return f"workers={workers}: the scenario's {nodes} node(s) of {per_node} replica(s) take 1 to {nodes} workers"
    if workers == 1:
        return None
    if not sync_s > 0:
        return f"sync_s={sync_s}: must be > 0"
    for refused, what in (
        (isinstance(scenario.workload.arrivals, ClientsArrivals), "a closed loop (arrivals kind clients)"),
        (scenario.scale_out is not None, "a scale_out"),
        (listens, "a step listener or an event trace"),
    ):
        if refused:
            return f"workers={workers} cannot run {what} (workers=1 can)"
    return None


def shards(num_replicas: int, workers: int, replicas_per_node: int) -> list[list[int]]:
    """Replica indices per shard: whole nodes, as even as the node count allows (``parallel_refusal`` checked)."""
    nodes = num_nodes(num_replicas, replicas_per_node)
    return [
        [
            i
            for node in group
            for i in range(node * replicas_per_node, min((node + 1) * replicas_per_node, num_replicas))
        ]
        for group in np.array_split(np.arange(nodes), workers)
    ]


class _Shard:
    """One shard's side of the protocol, in whichever process steps it."""

    def __init__(self, loop: EventLoop, indices: list[int]) -> None:
        self.loop, self.indices = loop, indices
        self.memory = loop.memory
        if self.memory is not None:
            self.memory.plan_on_tick = True
        # What the last report said of each replica: a report carries only what changed.
        self._routed: dict[int, Routed] = {}
        self._memory: dict[int, MemoryState] = {}

    def advance(self, arrivals: list[Arrival], decisions: Decisions, until_s: float) -> _Report:
        memory = self.memory
        if memory is not None and decisions:
            memory.follow(decisions)
        self.loop.deliver(arrivals)
        self.loop.run(until_s)
        routed = []
        for i in self.indices:
            replica = self.loop.replicas[i]
            now = (replica.num_outstanding, replica.draft_resident, replica.kv_expanded, replica.in_flight())
            if self._routed.get(i) != now:
                self._routed[i] = now
                routed.append((i, now))
        states, due = [], False
        if memory is not None:
            if memory.planner is not None:
                for i in self.indices:
                    state = memory.state_of(i)
                    if self._memory.get(i) != state:
                        self._memory[i] = state
                        states.append((i, state))
            due, memory.plan_due = memory.plan_due, False
        next_s = self.loop.queue.next_s() if not self.loop.idle else math.inf
        return _Report(routed, states, due, next_s, self.loop.end_s)

    def results(self, table: RequestTable) -> dict[str, Any]:
        """What the coordinator needs of this shard at the end: its replicas (without the table), its requests'
        rows, its memory record."""
        replicas = [self.loop.replicas[i] for i in self.indices]
        for replica in replicas:
            replica.table = None  # type: ignore[assignment]  # the coordinator's table replaces it
        rows = np.flatnonzero(np.isin(table.replica, self.indices))
        memory = self.memory
        return {
            "replicas": replicas,
            "rows": rows,
            "columns": {name: column[rows] for name, column in vars(table).items()},
            "changes": memory.changes if memory is not None else [],
            "reloads": memory.reloads if memory is not None else [],
        }


def _serve(shard: _Shard, table: RequestTable, conn: Connection) -> None:
    """A worker process: advance on each message, send the results on ``None``; stop when the coordinator hangs up."""
    try:
        while (message := conn.recv()) is not None:
            conn.send(shard.advance(*message))
        conn.send(shard.results(table))
    except EOFError:
        pass  # the coordinator stopped (its own shard failed): nothing to report
    except BaseException:  # noqa: BLE001 - anything a worker raises goes to the coordinator, which raises it
        first, last = shard.indices[0], shard.indices[-1]
        conn.send(RuntimeError(f"simulator worker for replicas {first}-{last} failed:\n{traceback.format_exc()}"))
    finally:
        conn.close()


def run_sharded(
    replicas: list[Replica],
    memory: DraftMemorySim | None,
    router: Router,
    feed: OpenLoop,
    groups: list[list[int]],
    sync_s: float,
) -> float:
    """Run the whole of an open-loop workload over ``groups`` of replicas in parallel; returns the run's end time.
    On return ``replicas``, the table and ``memory`` hold every shard's results, as a one-process run leaves them."""
    table = feed.table
    loops = [EventLoop(replicas, memory) for _ in groups]
    shard_list = [_Shard(loop, group) for loop, group in zip(loops, groups, strict=True)]
    context = multiprocessing.get_context("fork")
    conns, processes = [], []
    try:
        for shard in shard_list[1:]:
            ours, theirs = context.Pipe()
            process = context.Process(target=_serve, args=(shard, table, theirs), daemon=True)
            process.start()
            theirs.close()
            conns.append(ours)
            processes.append(process)
        end_s = _coordinate(shard_list[0], conns, groups, router, memory, feed, sync_s)
        for conn in conns:
            conn.send(None)
        for conn in conns:
            _merge(_receive(conn), replicas, table, memory)
        if memory is not None:
            memory.changes.sort(key=lambda c: c.time_s)
            memory.reloads.sort(key=lambda r: (r.resident_s, r.replica))
        _warn_short_steps(replicas, sync_s)
        return end_s
    finally:
        for conn in conns:
            conn.close()  # a worker still waiting for a window sees the end of its pipe and stops
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()


def _coordinate(
    local: _Shard,
    conns: list[Connection],
    groups: list[list[int]],
    router: Router,
    memory: DraftMemorySim | None,
    feed: OpenLoop,
    sync_s: float,
) -> float:
    arrival_s = feed.workload.arrival_s.tolist()
    shard_of = {i: s for s, group in enumerate(groups) for i in group}
    views = [_View(i, 0, local.loop.replicas[i].draft_resident, False) for i in range(len(local.loop.replicas))]
    planning = memory is not None and memory.planner is not None
    states: dict[int, MemoryState] = {}
    # The in-flight steps' ends, each with its finishes: applied to the view as an arrival passes them, so the router
    # sees a step's finishes on time (a step that both starts and ends within a window is seen at the next sync).
    ends: list[tuple[float, int, int]] = []
    steps: dict[int, tuple[float, int] | None] = {}  # each replica's in-flight step as last reported
    decisions: list[Decisions] = [[] for _ in groups]
    next_request, window, end_s = 0, 0, 0.0
    while True:
        # Windows lie on one grid, [n * sync_s, (n + 1) * sync_s); those in which nothing happens are skipped.
        until_s = (window + 1) * sync_s
        arrivals: list[list[Arrival]] = [[] for _ in groups]
        while next_request < len(arrival_s) and arrival_s[next_request] < until_s:
            time_s = arrival_s[next_request]
            while ends and ends[0][0] <= time_s:  # a step ending at an arrival's instant ends first (events.py)
                _, i, finishes = heapq.heappop(ends)
                views[i].num_outstanding -= finishes
            view = router.route(next_request, views)
            view.num_outstanding += 1
            arrivals[shard_of[view.index]].append((time_s, next_request, view.index))
            next_request += 1
        for s, conn in enumerate(conns, start=1):
            conn.send((arrivals[s], decisions[s], until_s))
        reports = [local.advance(arrivals[0], decisions[0], until_s)] + [_receive(conn) for conn in conns]
        due = False
        for report in reports:
            for i, routed in report.routed:
                view, steps[i] = views[i], routed[3]
                view.num_outstanding, view.draft_resident, view.kv_expanded = routed[0], routed[1], routed[2]
            states.update(report.memory)
            due = due or report.plan_due
            end_s = max(end_s, report.end_s)
        ends = [(step[0], i, step[1]) for i, step in steps.items() if step is not None and step[1]]
        heapq.heapify(ends)
        decisions = [[] for _ in groups]
        if planning and due:
            assert memory is not None
            for i, kind in memory.plan([memory.view_of(i, state) for i, state in sorted(states.items())]):
                decisions[shard_of[i]].append((i, kind))
        next_s = min(
            min(r.next_s for r in reports), arrival_s[next_request] if next_request < len(arrival_s) else math.inf
        )
        if any(decisions):
            window += 1
        elif next_s == math.inf:
            return end_s
        else:
            window = max(window + 1, math.floor(next_s / sync_s))


class ShortStepWarning(UserWarning):
    """A parallel run had steps shorter than its sync interval: the router saw some finishes late."""


def _warn_short_steps(replicas: list[Replica], sync_s: float) -> None:
    """The router's view is exact only for steps longer than a window: say so when the run had shorter ones."""
    durations = [np.asarray(r.series_end_s) - np.asarray(r.series_time_s) for r in replicas if r.series_end_s]
    if not durations:
        return
    every = np.concatenate(durations)
    short = int(np.count_nonzero(every < sync_s))
    if short:
        warnings.warn(
            f"sync_s={sync_s}: {short} of {len(every)} steps were shorter (the shortest {every.min() * 1e3:.2f} ms), "
            "so the router saw some requests' finishes up to a window late; a sync_s below the shortest step "
            "routes exactly as one process",
            ShortStepWarning,
            stacklevel=4,
        )


def _receive(conn: Connection) -> Any:
    message = conn.recv()
    if isinstance(message, BaseException):
        raise message
    return message


def _merge(
    results: dict[str, Any], replicas: list[Replica], table: RequestTable, memory: DraftMemorySim | None
) -> None:
    rows = results["rows"]
    for name, values in results["columns"].items():
        getattr(table, name)[rows] = values
    for replica in results["replicas"]:
        replica.table = table
        replicas[replica.index] = replica
        if memory is not None:
            memory.replicas[replica.index] = replica
            assert replica.memory is not None
            memory.machines[replica.index] = replica.memory
    if memory is not None:
        memory.changes.extend(results["changes"])
        memory.reloads.extend(results["reloads"])
