"""The draft residency state machine: when to give the draft's memory to the KV cache and when to take it back
(Nightjar §6).

    RESIDENT --offload--> OFFLOADING --done--> OFFLOADED (pool expanded) --contract--> CONTRACTING
        ^                     | failed                                                    | done
        +---------------------+                                                           v
        +<--------------------------------------------- done ----------------------- RELOADING
                                                  failed: back to OFFLOADED, pool re-expanded

Triggers, each held for ``window_steps`` consecutive steps:
- offload: the policy keeps k = 0 and free blocks stay below ``low_free_ratio`` of the pool; after a successful
  reload it also waits until the draft has been resident ``min_resident_s`` (the dwell), so that an oscillating
  load does not throw away a draft just copied back. The window counts meanwhile, so pressure that held W steps
  offloads at the dwell's end. The initial RESIDENT state has no dwell;
- reload: the waiting queue is empty and free blocks cover the draft plus a safety buffer; then contraction waits
  (up to ``drain_timeout_s``) until few live blocks remain in the extra region, and moves those (migration.py).

Transfers are asynchronous: the machine only emits actions and is told when each finished or failed, with the
time carried in the call (house rule 2: no loop counts, no clock of its own). A failed transfer leaves the draft
offloaded (or resident, for an offload) and is retried after a doubling backoff. Speculation must be off (k = 0)
whenever the draft is not RESIDENT: contraction and reload happen before speculation is re-enabled (Nightjar §6.5).

Offload and reload are wanted by the machine and granted by someone: the machine itself when it runs alone
(``self_grant``), or a cluster planner (cluster_plan.py) that caps concurrent transfers per node and keeps a floor
of resident drafts. A want is withdrawn, with any grant, as soon as its trigger stops holding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, assert_never

from specserve.memory.capacity import KvCapacity
from specserve.memory.migration import MigrationPlan, plan_migration
from specserve.memory.params import ResidencyParams

# Declared with the telemetry that reports it (the engine's state crosses to the replica and the controller).
from specserve.messages import DraftState, MemoryDecision


@dataclass(frozen=True, slots=True)
class MemoryStep:
    """What the scheduler knows after a step, for the machine's triggers."""

    now_s: float
    # The k the policy chose for the step: offload is considered only while it is 0.
    k: int
    num_waiting: int
    num_kv_blocks_free: int
    # Live blocks with ids >= N_base; only read while the pool is expanded, for drain-aware contraction.
    num_live_extra_blocks: int = 0


class BlockLayout(Protocol):
    """The allocator's view the migration plan needs; asked only when contraction starts."""

    def live_extra_blocks(self) -> Sequence[int]: ...

    def free_base_blocks(self, count: int) -> Sequence[int]:
        """Up to ``count`` free block ids below N_base."""
        ...


@dataclass(frozen=True, slots=True)
class StartOffload:
    """Evict the draft's weights (a host copy stays); report with ``offload_done``."""

    reason: str


@dataclass(frozen=True, slots=True)
class ExpandPool:
    """Append ``num_blocks`` free blocks, ids [N_base, N_exp), to the KV pool."""

    num_blocks: int
    reason: str


@dataclass(frozen=True, slots=True)
class StartContraction:
    """Allocate only below N_base from now on, move the plan's blocks, then drop the extra region; report with
    ``contraction_done``."""

    plan: MigrationPlan
    reason: str


@dataclass(frozen=True, slots=True)
class StartReload:
    """Copy the draft's weights back to the device; report with ``reload_done``. Its KV must then be rebuilt
    over every running request's whole context."""

    reason: str


Action = StartOffload | ExpandPool | StartContraction | StartReload


class ResidencyMachine:
    def __init__(self, capacity: KvCapacity, params: ResidencyParams | None = None, self_grant: bool = True) -> None:
        self.capacity = capacity
        self.params = params or ResidencyParams()
        self.self_grant = self_grant
        self.state = DraftState.RESIDENT
        self.offload_wanted = False
        self.offload_granted = False
        self.reload_wanted = False
        self.reload_granted = False
        # Why the machine is where it is, for logs and the status table.
        self.reason = "draft resident"
        self._streak = 0
        self._drain_since_s: float | None = None
        self._retry_at_s = -math.inf
        self._resident_since_s = -math.inf  # the last successful reload; no dwell before the first
        self._num_failures = 0
        p, c = self.params, capacity
        self.low_free_blocks = math.ceil(p.low_free_ratio * c.num_base_blocks)
        self.reload_free_blocks = c.num_draft_blocks + math.ceil(p.reload_buffer_ratio * c.num_base_blocks)
        self.max_migrate_blocks = math.floor(p.max_migrate_ratio * c.num_draft_blocks)

    @property
    def draft_resident(self) -> bool:
        """Speculation is allowed (k > 0) only when True."""
        return self.state is DraftState.RESIDENT

    @property
    def num_kv_blocks_total(self) -> int:
        """Blocks allocatable now: expanded only while OFFLOADED, since contraction first closes the extra region."""
        c = self.capacity
        return c.num_expanded_blocks if self.state is DraftState.OFFLOADED else c.num_base_blocks

    # -- grants from outside (a cluster planner) ---------------------------------------------------------

    def grant_offload(self) -> None:
        if self.offload_wanted:
            self.offload_granted = True

    def grant_reload(self) -> None:
        if self.reload_wanted:
            self.reload_granted = True

    def follow(self, decision: MemoryDecision) -> None:
        """A cluster planner's decision on this machine's want: a grant lets it act, a queued reload or a refused
        offload leaves the want waiting for a later decision."""
        match decision:
            case MemoryDecision.GRANT_RELOAD:
                self.grant_reload()
            case MemoryDecision.GRANT_OFFLOAD:
                self.grant_offload()
            case MemoryDecision.QUEUE_RELOAD | MemoryDecision.REFUSE_OFFLOAD:
                pass
            case _:
                assert_never(decision)

    def revoke_reload(self) -> None:
        """A planner may take back a grant the machine has not acted on yet."""
        if self.state is DraftState.OFFLOADED:
            self.reload_granted = False
            self._drain_since_s = None

    # -- the per-step triggers ------------------------------------------------------------------------

    def step(self, obs: MemoryStep, layout: BlockLayout | None = None) -> list[Action]:
        """Advance the triggers by one scheduler step; ``layout`` is needed only when contraction can start."""
        if self.state is DraftState.RESIDENT:
            return self._while_resident(obs)
        if self.state is DraftState.OFFLOADED:
            return self._while_offloaded(obs, layout)
        return []  # a transfer is in flight; its completion call moves the machine

    def _while_resident(self, obs: MemoryStep) -> list[Action]:
        pressed = obs.k == 0 and obs.num_kv_blocks_free < self.low_free_blocks
        self._streak = self._streak + 1 if pressed else 0
        resident_s = obs.now_s - self._resident_since_s
        dwelling = resident_s < self.params.min_resident_s
        if self._streak < self.params.window_steps or obs.now_s < self._retry_at_s or dwelling:
            self._withdraw_offload()
            if obs.now_s >= self._retry_at_s:  # else the failure's reason stands until the retry
                if not pressed:
                    self.reason = "draft resident"
                elif dwelling:
                    self.reason = (
                        f"KV pressure for {self._streak} steps; resident for {resident_s:.2f} s of the "
                        f"{self.params.min_resident_s:g} s dwell after a reload"
                    )
                else:
                    self.reason = "KV pressure, within the window"
            return []
        self.offload_wanted = True
        self.offload_granted = self.offload_granted or self.self_grant
        if not self.offload_granted:
            self.reason = "offload wanted, waiting for a grant"
            return []
        why = f"k = 0 and free blocks < {self.low_free_blocks} for {self._streak} steps"
        self._enter(DraftState.OFFLOADING)
        self.reason = f"offloading: {why}"
        return [StartOffload(why)]

    def _while_offloaded(self, obs: MemoryStep, layout: BlockLayout | None) -> list[Action]:
        calm = obs.num_waiting == 0 and obs.num_kv_blocks_free >= self.reload_free_blocks
        self._streak = self._streak + 1 if calm else 0
        if self._streak < self.params.window_steps or obs.now_s < self._retry_at_s:
            self._withdraw_reload()
            if obs.now_s >= self._retry_at_s:
                self.reason = "offloaded: calm, within the window" if calm else "offloaded: load still high"
            return []
        self.reload_wanted = True
        self.reload_granted = self.reload_granted or self.self_grant
        if not self.reload_granted:
            self.reason = "reload wanted, waiting for a grant"
            return []
        if self._drain_since_s is None:
            self._drain_since_s = obs.now_s
        live = obs.num_live_extra_blocks
        waited_s = obs.now_s - self._drain_since_s
        if live > self.max_migrate_blocks and waited_s < self.params.drain_timeout_s:
            self.reason = f"draining: {live} live blocks in the extra region > {self.max_migrate_blocks}"
            return []
        if layout is None:
            raise ValueError("contraction needs the allocator's BlockLayout")
        free = layout.free_base_blocks(live)
        if len(free) < live:  # too few free blocks below the region to take the live ones yet
            self.reason = f"draining: {live} live blocks in the extra region, {len(free)} free below it"
            return []
        plan = plan_migration(self.capacity.num_base_blocks, layout.live_extra_blocks(), free)
        why = f"queue empty, free >= {self.reload_free_blocks} for {self._streak} steps; moving {plan.num_moved} blocks"
        self._enter(DraftState.CONTRACTING)
        self.reason = f"contracting: {why}"
        return [StartContraction(plan, why)]

    # -- transfer completions ---------------------------------------------------------------------------

    def offload_done(self, now_s: float, ok: bool = True) -> list[Action]:
        self._expect(DraftState.OFFLOADING)
        if not ok:
            self._fail(now_s, DraftState.RESIDENT, "offload failed; draft still resident")
            return []
        self._num_failures = 0
        self._enter(DraftState.OFFLOADED)
        self.reason = "offloaded: KV pool expanded"
        return [ExpandPool(self.capacity.num_draft_blocks, "draft offloaded")]

    def contraction_done(self, now_s: float, ok: bool = True) -> list[Action]:
        self._expect(DraftState.CONTRACTING)
        if not ok:
            self._fail(now_s, DraftState.OFFLOADED, "contraction failed; extra region reopened")
            return [ExpandPool(self.capacity.num_draft_blocks, "contraction failed")]
        self._enter(DraftState.RELOADING)
        self.reason = "reloading the draft"
        return [StartReload("pool back at its baseline")]

    def reload_done(self, now_s: float, ok: bool = True) -> list[Action]:
        self._expect(DraftState.RELOADING)
        if not ok:
            # The draft's memory is still free: hand it back to the KV cache while waiting to retry.
            self._fail(now_s, DraftState.OFFLOADED, "reload failed; speculation stays off")
            return [ExpandPool(self.capacity.num_draft_blocks, "reload failed")]
        self._num_failures = 0
        self._resident_since_s = now_s
        self._enter(DraftState.RESIDENT)
        self.reason = "draft resident again"
        return []

    # -- helpers ------------------------------------------------------------------------------------------

    def _enter(self, state: DraftState) -> None:
        self.state = state
        self._streak = 0
        self._drain_since_s = None
        self.offload_wanted = self.offload_granted = False
        self.reload_wanted = self.reload_granted = False

    def _fail(self, now_s: float, state: DraftState, why: str) -> None:
        self._num_failures += 1
        backoff_s = min(self.params.retry_s * 2 ** (self._num_failures - 1), self.params.retry_max_s)
        self._retry_at_s = now_s + backoff_s
        self._enter(state)
        self.reason = f"{why}; retry after {backoff_s:g} s"

    def _withdraw_offload(self) -> None:
        self.offload_wanted = self.offload_granted = False

    def _withdraw_reload(self) -> None:
        self.reload_wanted = self.reload_granted = False
        self._drain_since_s = None

    def _expect(self, state: DraftState) -> None:
        if self.state is not state:
            raise RuntimeError(f"transfer report for {state.value} while {self.state.value}")
