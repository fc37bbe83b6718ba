"""Draft offload and reload across the simulated replicas: specserve.memory's state machine and cluster planner,
driven in virtual time (Nightjar §6, App. E).

After each step a replica's ``ResidencyMachine`` sees the step (k, waiting, free blocks) and may emit actions,
applied here: offload and contraction take the device-local times of the scenario's ``memory`` config, then the
pool grows (or has shrunk) by the draft's blocks; a reload copies the draft's bytes over its node's host link,
shared with the node's other copies (transfers.py). A reloaded draft has no KV: every running request lags by its
whole context, which the replica's catch-up pays (replica.draft_reloaded). With ``coordination: planner`` machines
do not grant themselves: the cluster planner does, whenever a want appears or a transfer ends.

The simulator knows block counts, not ids, so the live blocks in the extra region (drain-aware contraction) are
estimated as the used blocks' share of the expanded pool: blocks spread evenly over the pool once it has turned
over. The migration plan is built over ids standing for those counts.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from specserve.memory import (
    Action,
    ClusterMemoryParams,
    DraftState,
    ExpandPool,
    KvCapacity,
    MemoryStep,
    ReplicaMemory,
    ResidencyMachine,
    ResidencyParams,
    StartContraction,
    StartOffload,
    StartReload,
    plan_cluster,
)
from specserve.messages import MemoryDecision
from specserve.sim.config import MemoryConfig
from specserve.sim.replica import Replica
from specserve.sim.scenario import ResolvedScenario
from specserve.sim.transfers import TransferLink


@dataclass(frozen=True, slots=True)
class CountedLayout:
    """Block ids standing for counts: live extra blocks from N_base up, free preserved blocks from 0 up."""

    num_base_blocks: int
    num_live_extra: int

    def live_extra_blocks(self) -> Sequence[int]:
        return range(self.num_base_blocks, self.num_base_blocks + self.num_live_extra)

    def free_base_blocks(self, count: int) -> Sequence[int]:
        return range(count)


@dataclass(slots=True)
class ReloadRecord:
    replica: int
    wanted_s: float  # the reload trigger first held (W steps)
    contraction_s: float  # the pool started shrinking: from here the replica has neither extra KV nor draft
    resident_s: float | None = None
    num_moved_blocks: int = 0


# A replica's draft state, its offload wanted and granted, its reload wanted and granted, and its expected gain.
MemoryState = tuple[DraftState, bool, bool, bool, bool, float]


@dataclass(frozen=True, slots=True)
class StateChange:
    time_s: float
    replica: int
    state: DraftState
    num_kv_blocks_total: int


class DraftMemorySim:
    def __init__(self, cfg: MemoryConfig, resolved: ResolvedScenario, replicas: list[Replica]) -> None:
        self.cfg = cfg
        self.replicas = replicas
        if resolved.draft is None:  # resolve() refuses offload for a method without weights
            raise ValueError(f"scenario {resolved.scenario.name!r}: no draft weights to offload")
        self.draft_bytes = int(resolved.draft.weight_bytes)
        self.capacity = KvCapacity(resolved.num_kv_blocks, self.draft_bytes, resolved.kv_block_bytes)
        params = ResidencyParams(
            low_free_ratio=cfg.low_free_ratio,
            window_steps=cfg.window_steps,
            reload_buffer_ratio=cfg.reload_buffer_ratio,
            max_migrate_ratio=cfg.max_migrate_ratio,
            drain_timeout_s=cfg.drain_timeout_s,
            min_resident_s=cfg.min_resident_s,
        )
        self.machines = [ResidencyMachine(self.capacity, params, cfg.coordination == "local") for _ in replicas]
        for replica, machine in zip(replicas, self.machines, strict=True):
            replica.memory = machine
        self.node_of = [i // cfg.replicas_per_node for i in range(len(replicas))]
        self.bytes_per_s = resolved.hardware.host_to_device_gb_s * 1e9
        self.links = [TransferLink(self.bytes_per_s) for _ in range(max(self.node_of, default=0) + 1)]
        self.planner = (
            ClusterMemoryParams(cfg.max_reload_s, cfg.max_concurrent_transfers, cfg.min_resident)
            if cfg.coordination == "planner"
            else None
        )
        self._due: list[tuple[float, int, str, int]] = []  # (time, seq, "offload" | "contract", replica)
        self._seq = 0
        self._wanted_s: list[float | None] = [None] * len(replicas)
        self._open: dict[int, ReloadRecord] = {}
        self.reloads: list[ReloadRecord] = []
        self.changes: list[StateChange] = []
        # In a shard of a parallel run (parallel.py) the planner runs at the sync points, over every shard's
        # replicas: a want here only marks a plan as due.
        self.plan_on_tick = False
        self.plan_due = False

    # -- called by the kernel -------------------------------------------------------------------------

    def after_step(self, replica: Replica, now_s: float) -> list[float]:
        """Feed the finished step to the replica's machine; times the kernel must wake us at."""
        i, machine = replica.index, self.machines[replica.index]
        live = self._live_extra(replica, machine)
        obs = MemoryStep(now_s, replica.series_k[-1], len(replica.waiting), replica.num_kv_blocks_free, live)
        # Only an offloaded machine can start a contraction, the one move that reads the layout.
        layout = CountedLayout(self.capacity.num_base_blocks, live) if machine.state is DraftState.OFFLOADED else None
        actions = machine.step(obs, layout)
        if machine.reload_wanted and self._wanted_s[i] is None:
            self._wanted_s[i] = now_s
        elif machine.state is DraftState.OFFLOADED and not machine.reload_wanted:
            self._wanted_s[i] = None
        wakes = self._apply(i, actions, now_s)
        if self.planner is not None and self._ungranted(machine):
            self._want_plan()
        return wakes

    def on_wake(self, now_s: float) -> list[float]:
        wakes: list[float] = []
        finished = False
        for link in self.links:
            done = link.pop_done(now_s)
            for i in done:
                wakes += self._apply(i, self.machines[i].reload_done(now_s), now_s)
                self.replicas[i].draft_reloaded()
                self._close_reload(i, now_s)
            # The copies left speed up: their finish moves earlier.
            if done and (t := link.next_done_s()) is not None:
                wakes.append(t)
            finished = finished or bool(done)
        while self._due and self._due[0][0] <= now_s:
            _, _, kind, i = heapq.heappop(self._due)
            machine = self.machines[i]
            actions = machine.offload_done(now_s) if kind == "offload" else machine.contraction_done(now_s)
            wakes += self._apply(i, actions, now_s)
        if finished and self.planner is not None:
            self._want_plan()
        return wakes

    # -- pieces -----------------------------------------------------------------------------------------

    def _apply(self, i: int, actions: list[Action], now_s: float) -> list[float]:
        wakes: list[float] = []
        replica, cap = self.replicas[i], self.capacity
        for action in actions:
            if isinstance(action, StartOffload):
                wakes.append(self._after(now_s + self.cfg.expand_s, "offload", i))
            elif isinstance(action, ExpandPool):
                replica.resize_pool(action.num_blocks)
            elif isinstance(action, StartContraction):
                replica.resize_pool(-cap.num_draft_blocks)
                wanted_s = self._wanted_s[i]
                wanted_s = now_s if wanted_s is None else wanted_s
                self._open[i] = ReloadRecord(i, wanted_s, now_s, num_moved_blocks=action.plan.num_moved)
                wakes.append(self._after(now_s + self.cfg.contract_s, "contract", i))
            elif isinstance(action, StartReload):
                link = self.links[self.node_of[i]]
                link.add(now_s, i, self.draft_bytes)
                wakes.append(link.next_done_s() or now_s)
        if actions:
            machine = self.machines[i]
            self.changes.append(StateChange(now_s, i, machine.state, replica.num_kv_blocks_total))
        return wakes

    def _after(self, time_s: float, kind: str, i: int) -> float:
        heapq.heappush(self._due, (time_s, self._seq, kind, i))
        self._seq += 1
        return time_s

    def _close_reload(self, i: int, now_s: float) -> None:
        record = self._open.pop(i)
        record.resident_s = now_s
        self.reloads.append(record)
        self._wanted_s[i] = None
        self.changes.append(StateChange(now_s, i, DraftState.RESIDENT, self.replicas[i].num_kv_blocks_total))

    def _live_extra(self, replica: Replica, machine: ResidencyMachine) -> int:
        if machine.state is not DraftState.OFFLOADED:
            return 0
        used = replica.num_kv_blocks_total - replica.num_kv_blocks_free
        return round(used * self.capacity.num_draft_blocks / self.capacity.num_expanded_blocks)

    @staticmethod
    def _ungranted(machine: ResidencyMachine) -> bool:
        return (machine.offload_wanted and not machine.offload_granted) or (
            machine.reload_wanted and not machine.reload_granted
        )

    def _want_plan(self) -> None:
        if self.plan_on_tick:
            self.plan_due = True
        else:
            self.follow(self.plan([self.view(i) for i in range(len(self.machines))]))

    def view(self, i: int) -> ReplicaMemory:
        """What the planner reads of replica ``i``."""
        return self.view_of(i, self.state_of(i))

    def state_of(self, i: int) -> MemoryState:
        """The planner's view of replica ``i`` as a plain tuple: cheap to compare and to send between processes."""
        m = self.machines[i]
        return (
            m.state,
            m.offload_wanted,
            m.offload_granted,
            m.reload_wanted,
            m.reload_granted,
            # The simulator's stand-in for the gain of speculating again: the requests that would speculate.
            float(len(self.replicas[i].batch)),
        )

    def view_of(self, i: int, state: MemoryState) -> ReplicaMemory:
        draft_state, offload_wanted, offload_granted, reload_wanted, reload_granted, gain = state
        return ReplicaMemory(
            replica_id=str(i),
            node_id=str(self.node_of[i]),
            deployment="default",
            state=draft_state,
            offload_wanted=offload_wanted,
            offload_granted=offload_granted,
            reload_wanted=reload_wanted,
            reload_granted=reload_granted,
            expected_gain=gain,
            draft_bytes=self.draft_bytes,
        )

    def plan(self, views: list[ReplicaMemory]) -> list[tuple[int, MemoryDecision]]:
        """The cluster planner's decisions over ``views``: (replica, decision)."""
        assert self.planner is not None
        bandwidth = {str(node): self.bytes_per_s for node in range(len(self.links))}
        return [(int(d.replica_id), d.kind) for d in plan_cluster(views, bandwidth, self.planner)]

    def follow(self, decisions: list[tuple[int, MemoryDecision]]) -> None:
        for i, kind in decisions:
            self.machines[i].follow(kind)
