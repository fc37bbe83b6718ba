"""One engine's draft residency, carried out: offload the draft and grow the KV pool into its bytes; contract
the pool and reload the draft (vLLM 0.32.0, EngineCore side).

Lives in the EngineCore next to the scheduler. Every change runs between two steps (``tick`` from the
EngineCore's ``post_step``, or an EngineCore utility call), so the worker (``draft_memory``, reached with
``collective_rpc``) and the scheduler's block pool (``kv_pool``) change together and no step sees one
without the other. While the draft is away the scheduler runs k = 0 and both processes skip every draft
pass (``draft_sync.skips_draft_pass`` with ``draft_resident`` false); a reloaded draft has no KV, so every
running request lags over its whole context and catches up as after a k = 0 stretch.

States (the names the status table and the metrics show): ``resident``; ``offloaded`` (draft dropped, pool
expanded by the draft-equivalent blocks); ``contracting`` (the grown region taken out of circulation: its free
blocks withheld, its live ones migrated to free blocks below it, Nightjar §6.4; it lasts past one call only while
too few free blocks are left below to take them); ``reloading`` (the pool cut back to its baseline, the draft
rebuilt on a worker thread while steps go on at k = 0, swapped in between two steps once built).

The draft's bytes are what its checkpoint's tensors take at the engine's dtype. A block holds a page of every
layer, target and draft; while the draft is away the worker lays the buffer out without the draft's pages, so
the offload lends the draft's weights and its share of every baseline block, and the draft-equivalent blocks are
those bytes over a target-only block's bytes, rounded up (``KvCapacity`` with ``draft_kv_bytes_per_block``).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from specserve.memory import (
    DraftState,
    KvCapacity,
    MemoryStep,
    MigrationPlan,
    ResidencyMachine,
    ResidencyParams,
    StartContraction,
    StartOffload,
    plan_migration,
)
from specserve.messages import Counts, DraftMemorySnapshot, DraftTransfers, MemoryDecision
from specserve.replicas.config.engine_args import EngineControlConfig
from specserve.replicas.draft_memory import kv_pool
from specserve.replicas.engine_log import engine_logger
from specserve.speculation.methods import method, offload_refusal

logger = engine_logger(__name__)


def checkpoint_bytes(model_dir: str, dtype: Any) -> int:
    """Bytes of the checkpoint's tensors held at ``dtype`` (a torch dtype): the draft's weights in the engine."""
    import torch
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {model_dir}")
    itemsize = torch.empty(0, dtype=dtype).element_size()
    numel = 0
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                numel += math.prod(f.get_slice(name).get_shape())
    return numel * itemsize


class MemoryCounters(Counts[DraftTransfers]):
    """Cumulative: the telemetry's ``DraftTransfers`` (declared and explained there only), counted as attributes,
    and what only ``describe`` reports about the latest transfers."""

    # Resident bytes of the worker before and after the latest drop and reload (the physically reclaimed memory).
    last_rss_freed_bytes: int
    last_rss_restored_bytes: int
    last_reload_s: float
    # The engine's pauses between two steps: the latest offload (drop and growth) and the latest contraction (its
    # last call: migration, the pool cut and the reload started).
    last_offload_pause_s: float
    last_contract_pause_s: float
    # Engine steps that ran while the latest reload rebuilt the draft, and how many of them at k = 0 (all, or
    # the draft was used before it was back).
    last_reload_steps: int
    last_reload_steps_k0: int
    history: list[tuple[float, str]]

    def __init__(self) -> None:
        super().__init__(DraftTransfers)
        self.last_rss_freed_bytes = self.last_rss_restored_bytes = 0
        self.last_reload_s = self.last_offload_pause_s = self.last_contract_pause_s = 0.0
        self.last_reload_steps = self.last_reload_steps_k0 = 0
        self.history = []


class ElasticDraft:
    """Offload and reload of one engine's draft; see the module docstring."""

    def __init__(self, scheduler: Any, auto: ResidencyParams | None = None) -> None:
        self.scheduler = scheduler
        # Why offload is refused on this engine ("" where it runs): the mechanism is built and tested on CPU
        # engines only. On a GPU, growing the KV buffer by reallocation needs the old and the new buffer at once,
        # which a nearly full GPU does not have, and the rebuild would need a CUDA stream of its own (README,
        # Memory elasticity).
        device = str(scheduler.vllm_config.device_config.device_type)
        self.refused = "" if device == "cpu" else f"elastic draft memory runs on CPU engines only (this one: {device})"
        spec = scheduler.vllm_config.speculative_config
        m = method(spec.method)
        if not m.offloadable:
            self.refused = offload_refusal(m)
        if self.refused and auto is not None:
            logger.warning("specserve: draft_offload is ignored: %s", self.refused)
            auto = None
        # With ``auto``, Nightjar's triggers (specserve.memory.ResidencyMachine) decide when to offload and reload;
        # built at the first step, once the worker has told the block's bytes.
        self.auto = auto
        self.machine: ResidencyMachine | None = None
        # A controller grants transfers (``coordinate``); without one the engine grants itself.
        self.coordinated = False
        self.state: DraftState = DraftState.RESIDENT
        self.baseline_blocks = kv_pool.pool_of(scheduler).num_gpu_blocks
        self.draft_bytes = 0
        try:
            if m.offloadable:
                self.draft_bytes = checkpoint_bytes(spec.draft_model_config.model, spec.draft_model_config.dtype)
        except (OSError, ValueError) as exc:  # a hub id, or another format: serving goes on, offload is refused
            logger.warning("specserve: the draft's size is unknown (%s); it will not be offloaded", exc)
        # The worker's block layout (bytes of a block over every layer, and the draft layers' share of them),
        # read at the first offload or the triggers' first step.
        self.bytes_per_block = 0
        self.draft_kv_bytes_per_block = 0
        self.counters = MemoryCounters()
        self._reload_started = 0.0
        self._reload_steps = (0, 0)
        # Why a contraction has not finished yet (empty when none waits).
        self.waiting = ""
        # Whether the KV cache has been moved into a reserve for the expanded pool (``_reserve``), or never will be.
        self._reserved = False

    @property
    def resident(self) -> bool:
        return self.state is DraftState.RESIDENT

    def offload(self, core: Any, reason: str = "asked by an operator") -> None:
        """Drop the draft and grow the pool by its bytes. Only from ``resident``."""
        if self.refused:
            raise RuntimeError(f"cannot offload the draft: {self.refused}")
        if self.state is not DraftState.RESIDENT:
            raise RuntimeError(f"cannot offload the draft: it is {self.state.value}")
        if not self.draft_bytes:
            raise RuntimeError("cannot offload the draft: its size is unknown (no local .safetensors checkpoint)")
        if not self.scheduler.skips_k0_draft_pass:
            raise RuntimeError("offloading the draft needs skip_k0_draft_pass: the draft's KV must be able to lag")
        started = time.perf_counter()
        self._read_layout(core)
        (dropped,) = core.collective_rpc("specserve_drop_draft")[:1]
        self.state = DraftState.OFFLOADED  # from here on no step may run the draft
        self.scheduler.draft_kv.draft_upto.clear()
        total = self._grow(core)
        c = self.counters
        c.num_offloads += 1
        c.last_offload_pause_s = time.perf_counter() - started
        c.offload_s += c.last_offload_pause_s
        c.bytes_offloaded += self.draft_bytes
        c.last_rss_freed_bytes = int(dropped["rss_before"] - dropped["rss_after"])
        self._log("offloaded", f"{reason}; {self.draft_bytes} draft bytes, pool {self.baseline_blocks} -> {total}")

    def reload(self, core: Any, reason: str = "asked by an operator") -> None:
        """Bring the draft back: contract the pool (migrating what is live in the grown region), then rebuild
        the draft in the background."""
        if self.state is not DraftState.OFFLOADED:
            raise RuntimeError(f"cannot reload the draft: it is {self.state.value}")
        self.state = DraftState.CONTRACTING
        self._log("contracting", f"{reason}; moving blocks >= {self.baseline_blocks} below it")
        self._contract(core)

    def capacity(self) -> KvCapacity:
        return KvCapacity(self.baseline_blocks, self.draft_bytes, self.bytes_per_block, self.draft_kv_bytes_per_block)

    def _read_layout(self, core: Any) -> None:
        (layout,) = core.collective_rpc("specserve_kv_layout")[:1]
        self.bytes_per_block = layout["bytes_per_block"]
        self.draft_kv_bytes_per_block = layout["draft_kv_bytes_per_block"]

    def before_schedule(self) -> None:
        """While contracting, or while the triggers wait for the grown blocks to drain before a reload, keep
        the blocks that are about to go out of circulation."""
        draining = self.machine is not None and self.machine.reload_granted
        if self.state is DraftState.CONTRACTING or (self.state is DraftState.OFFLOADED and draining):
            kv_pool.withhold_from(self.scheduler, self.baseline_blocks)

    def tick(self, core: Any) -> None:
        """After a step: let the triggers act (``auto``), go on with a contraction, adopt a rebuilt draft."""
        if not self._reserved:
            self._reserve(core)
        if self.auto is not None and self.draft_bytes:
            self._follow_triggers(core)
        if self.state is DraftState.CONTRACTING:
            self._contract(core)
        self.poll_reload(core)

    def poll_reload(self, core: Any) -> None:
        """Swap a rebuilt draft in once every worker has built it. Between two steps, or from a utility call on
        an idle engine (no step runs then to do it)."""
        if self.state is not DraftState.RELOADING or "loading" in core.collective_rpc("specserve_reload_state"):
            return
        try:
            (restored,) = core.collective_rpc("specserve_finish_reload")[:1]
        except Exception as exc:
            self._reload_failed(core, exc)
            return
        self.scheduler.draft_kv.draft_upto.clear()  # the new draft has no KV: every request catches up
        self.state = DraftState.RESIDENT
        c = self.counters
        c.num_reloads += 1
        c.last_reload_s = time.perf_counter() - self._reload_started
        c.reload_s += c.last_reload_s
        c.bytes_reloaded += self.draft_bytes
        (steps, steps_k0), (before, before_k0) = self._step_counts(), self._reload_steps
        c.last_reload_steps, c.last_reload_steps_k0 = steps - before, steps_k0 - before_k0
        c.last_rss_restored_bytes = int(restored["rss_after"] - restored["rss_before"])
        self._log("resident", f"reloaded in {c.last_reload_s:.3f} s, built in {restored['seconds']:.3f} s meanwhile")
        if self.machine is not None and self.machine.state is DraftState.RELOADING:
            self.machine.reload_done(time.monotonic())

    def _follow_triggers(self, core: Any) -> None:
        if self.machine is None:
            self._read_layout(core)
            self.machine = ResidencyMachine(self.capacity(), self.auto, self_grant=not self.coordinated)
        machine, scheduler = self.machine, self.scheduler
        if machine.state in (DraftState.RESIDENT, DraftState.OFFLOADED) and machine.state is not self.state:
            return  # an operator's offload or reload is under way; the triggers wait for it to end
        pool = kv_pool.pool_of(scheduler)
        step = MemoryStep(
            now_s=time.monotonic(),
            k=scheduler.k,
            num_waiting=len(scheduler.waiting),
            num_kv_blocks_free=pool.get_num_free_blocks(),
            num_live_extra_blocks=len(self.live_extra_blocks()),
        )
        for action in machine.step(step, layout=self):
            if isinstance(action, StartOffload):
                try:
                    self.offload(core, reason=action.reason)
                except Exception:
                    logger.exception("specserve: offloading the draft failed; it stays resident")
                    machine.offload_done(time.monotonic(), ok=False)
                else:
                    machine.offload_done(time.monotonic())  # its ExpandPool is done: offload() grew the pool
            elif isinstance(action, StartContraction):
                self.state = DraftState.CONTRACTING
                self._log("contracting", action.reason)
                self._contract(core, action.plan)  # the plan is fresh: nothing ran since the machine read it
                machine.contraction_done(time.monotonic())

    # BlockLayout, for the triggers' migration plan.
    def live_extra_blocks(self) -> list[int]:
        return kv_pool.live_blocks_from(self.scheduler, self.baseline_blocks)

    def free_base_blocks(self, count: int) -> list[int]:
        return kv_pool.free_blocks_below(self.scheduler, self.baseline_blocks, count)

    def _contract(self, core: Any, plan: MigrationPlan | None = None) -> None:
        """Take the grown region out of circulation, migrate its live blocks, cut the pool, start the reload.
        Without a plan, one is made now; with too few free blocks below the region, wait for a later step."""
        started = time.perf_counter()
        kv_pool.withhold_from(self.scheduler, self.baseline_blocks)
        if plan is None:
            live = self.live_extra_blocks()
            try:
                plan = plan_migration(self.baseline_blocks, live, self.free_base_blocks(len(live)))
            except ValueError:
                self.waiting = f"{len(live)} live blocks in the grown region, too few free below it"
                return
        self.waiting = ""
        if plan.moves:
            migrating = time.perf_counter()
            moves = [(move.source, move.destination) for move in plan.moves]
            try:
                kv_pool.migrate(self.scheduler, moves)
            except RuntimeError as exc:  # refused before any change: try again after a later step
                self.waiting = str(exc)
                return
            core.collective_rpc("specserve_migrate_blocks", args=(moves,))
            self.counters.blocks_migrated += len(moves)
            self.counters.migrate_s += time.perf_counter() - migrating
        self._reload_started = time.perf_counter()
        self._reload_steps = self._step_counts()
        core.collective_rpc("specserve_resize_kv", args=(self.baseline_blocks, False))  # the draft's pages again
        kv_pool.shrink(self.scheduler, self.baseline_blocks)
        self.state = DraftState.RELOADING
        self.counters.last_contract_pause_s = time.perf_counter() - started
        self._log("reloading", f"pool back at {self.baseline_blocks} blocks ({plan.num_moved} migrated)")
        try:
            core.collective_rpc("specserve_begin_reload")
        except Exception as exc:
            self._reload_failed(core, exc)

    def _step_counts(self) -> tuple[int, int]:
        counters = self.scheduler.counters
        return counters.num_steps, counters.num_steps_by_k[0]

    def _reload_failed(self, core: Any, exc: Exception) -> None:
        """The engine keeps serving at k = 0; the pool is grown again for it."""
        self.counters.num_reload_failures += 1
        logger.error("specserve: reloading the draft failed (%s); speculation stays off", exc)
        self._grow(core)
        self.state = DraftState.OFFLOADED
        self._log("offloaded", f"reload failed: {exc}")
        if self.machine is not None and self.machine.state is DraftState.RELOADING:
            self.machine.reload_done(time.monotonic(), ok=False)

    def _grow(self, core: Any) -> int:
        """Lend the draft's bytes (weights and KV pages) to the KV cache: the worker's tensors first, then the
        scheduler's pool."""
        total = self.capacity().num_expanded_blocks
        core.collective_rpc("specserve_resize_kv", args=(total, True, total))
        kv_pool.grow(self.scheduler, total)
        return total

    def _reserve(self, core: Any) -> None:
        """Move the KV cache into a buffer laid out for the expanded pool, so that no offload or reload copies it
        (``kv_reserve``). Once, after the engine's first step, copying the pages of the requests then running."""
        self._reserved = True
        if (
            self.refused
            or not self.draft_bytes
            or not self.scheduler.skips_k0_draft_pass
            or self.state is not DraftState.RESIDENT
        ):
            return
        if not self.bytes_per_block:
            self._read_layout(core)
        total = self.capacity().num_expanded_blocks
        try:
            (done,) = core.collective_rpc("specserve_resize_kv", args=(self.baseline_blocks, False, total))[:1]
        except Exception:  # vLLM's buffer stays, and an offload would fail on the same layout: serving goes on
            logger.exception("specserve: the KV cache could not be reserved for %d blocks", total)
            return
        logger.info("specserve: KV cache reserved for %d blocks in %.3f s", total, done["seconds"])

    def _log(self, state: str, reason: str) -> None:
        self.counters.history.append((time.time(), f"{state}: {reason}"))
        del self.counters.history[:-32]
        logger.info("specserve: draft %s (%s)", state, reason)

    def coordinate(self, coordinated: bool) -> None:
        """From now on a controller grants transfers (true), or the engine grants itself (false)."""
        self.coordinated = coordinated
        if self.machine is not None:
            self.machine.self_grant = not coordinated

    def apply_directive(self, decision: MemoryDecision) -> None:
        """A controller's ``MemoryDirective``; a queued reload or refused offload only leaves the want waiting."""
        if self.machine is not None:
            self.machine.follow(decision)

    def snapshot(self) -> DraftMemorySnapshot:
        """The telemetry's part this object owns."""
        m = self.machine
        return DraftMemorySnapshot(
            state=self.state,
            baseline_blocks=self.baseline_blocks,
            draft_bytes=self.draft_bytes,
            offload_wanted=bool(m and m.offload_wanted),
            offload_granted=bool(m and m.offload_granted),
            reload_wanted=bool(m and m.reload_wanted),
            reload_granted=bool(m and m.reload_granted),
            reason=m.reason if m is not None else ("" if self.auto is None else "waiting for the first step"),
            coordinated=self.coordinated,
            transfers=self.counters.snapshot(),
        )

    def describe(self) -> dict[str, Any]:
        pool = kv_pool.pool_of(self.scheduler)
        c = self.counters
        return {
            "state": self.state.value,
            "draft_bytes": self.draft_bytes,
            "bytes_per_block": self.bytes_per_block,
            "draft_kv_bytes_per_block": self.draft_kv_bytes_per_block,
            "kv_blocks_baseline": self.baseline_blocks,
            "kv_blocks_total": pool.num_gpu_blocks,
            "kv_blocks_free": pool.get_num_free_blocks(),
            "kv_blocks_live_extra": len(self.live_extra_blocks()),
            "waiting": self.waiting,
            **{name: value for name, value in c.values().items() if name != "history"},
            # The latest transitions, oldest first, each "state: reason".
            "events": [event for _, event in c.history],
        }


def residency_params(control: EngineControlConfig) -> ResidencyParams | None:
    """Nightjar's triggers as configured (drain-aware contraction with the default migration bounds), or None
    (offload only when asked)."""
    offload = control.draft_offload
    if offload is None:
        return None
    return ResidencyParams(
        low_free_ratio=offload.low_free_ratio,
        window_steps=offload.window_steps,
        min_resident_s=offload.min_resident_s,
    )
