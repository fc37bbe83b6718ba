"""The draft residency state machine: Nightjar's triggers (§6.1), asynchronous transfers, failures, grants."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from specserve.memory import (
    DraftState,
    ExpandPool,
    KvCapacity,
    MemoryStep,
    ResidencyMachine,
    ResidencyParams,
    StartContraction,
    StartOffload,
    StartReload,
)

# 1000 baseline blocks, a draft worth 200: offload below 100 free (eta 10 %), reload at >= 200 + 200 free.
CAPACITY = KvCapacity(num_base_blocks=1000, draft_bytes=200 * 64, bytes_per_block=64)
PARAMS = ResidencyParams(window_steps=3, retry_s=5.0, retry_max_s=20.0, drain_timeout_s=2.0)
PRESSED = 50  # free blocks under pressure
CALM = 600  # free blocks in the expanded pool with room for the draft and the buffer


class Layout:
    """A fake allocator: live extra blocks from 1000 up, free preserved blocks from 0 up."""

    def __init__(self, num_live_extra: int = 0, num_free_base: int | None = None) -> None:
        self.num_free_base = num_free_base
        self.num_live_extra = num_live_extra

    def live_extra_blocks(self) -> Sequence[int]:
        return range(1000, 1000 + self.num_live_extra)

    def free_base_blocks(self, count: int) -> Sequence[int]:
        return range(count if self.num_free_base is None else min(count, self.num_free_base))


def step(machine: ResidencyMachine, t: float, k: int = 0, free: int = PRESSED, waiting: int = 0, live: int = 0):
    return machine.step(MemoryStep(t, k, waiting, free, live), Layout(live))


def offloaded(machine: ResidencyMachine | None = None, t: float = 0.0) -> ResidencyMachine:
    machine = machine or ResidencyMachine(CAPACITY, PARAMS)
    actions = []
    for i in range(PARAMS.window_steps):
        actions = step(machine, t + i * 0.01, free=PRESSED, waiting=5)
    if not machine.self_grant:
        machine.grant_offload()
        actions = step(machine, t + 0.05, free=PRESSED, waiting=5)
    assert [type(a) for a in actions] == [StartOffload]
    machine.offload_done(t + 0.1)
    return machine


def test_offload_fires_only_after_w_consecutive_steps_at_k0_under_pressure() -> None:
    machine = ResidencyMachine(CAPACITY, PARAMS)
    assert step(machine, 0.0) == [] and step(machine, 0.1) == []
    actions = step(machine, 0.2)
    assert [type(a) for a in actions] == [StartOffload]
    assert "for 3 steps" in actions[0].reason, "the reason counts the window that fired it"
    assert machine.state is DraftState.OFFLOADING and not machine.draft_resident


def test_a_speculating_step_or_enough_free_blocks_restart_the_window() -> None:
    machine = ResidencyMachine(CAPACITY, PARAMS)
    step(machine, 0.0)
    step(machine, 0.1)
    step(machine, 0.2, k=2)  # the policy speculates: no offload, and the window starts over
    step(machine, 0.3)
    step(machine, 0.4)
    step(machine, 0.5, free=100)  # exactly eta free is not below it
    step(machine, 0.6)
    assert step(machine, 0.7) == []
    assert machine.state is DraftState.RESIDENT
    assert [type(a) for a in step(machine, 0.8)] == [StartOffload]


def test_offload_done_expands_the_pool_by_the_draft_equivalent_blocks() -> None:
    machine = ResidencyMachine(CAPACITY, PARAMS)
    for t in (0.0, 0.1, 0.2):
        step(machine, t)
    assert machine.num_kv_blocks_total == CAPACITY.num_base_blocks
    actions = machine.offload_done(0.3)
    assert actions == [ExpandPool(CAPACITY.num_draft_blocks, "draft offloaded")]
    assert machine.state is DraftState.OFFLOADED
    assert machine.num_kv_blocks_total == CAPACITY.num_base_blocks + CAPACITY.num_draft_blocks


def test_reload_needs_an_empty_queue_and_room_for_draft_and_buffer_for_w_steps() -> None:
    machine = offloaded()
    for i in range(10):
        assert step(machine, 1 + i * 0.01, free=CALM, waiting=1) == []  # requests still queue
    for i in range(10):
        assert step(machine, 2 + i * 0.01, free=machine.reload_free_blocks - 1) == []  # no room for draft + buffer
    assert step(machine, 3.0, free=CALM) == [] and step(machine, 3.01, free=CALM) == []
    actions = step(machine, 3.02, free=CALM)
    assert [type(a) for a in actions] == [StartContraction]
    # Contraction closes the extra region at once: allocations come only from the preserved blocks.
    assert machine.state is DraftState.CONTRACTING and machine.num_kv_blocks_total == CAPACITY.num_base_blocks
    assert [type(a) for a in machine.contraction_done(3.1)] == [StartReload]
    assert machine.state is DraftState.RELOADING and not machine.draft_resident
    assert machine.reload_done(3.5) == []
    assert machine.draft_resident


def test_contraction_waits_for_the_extra_region_to_drain_then_moves_what_is_left() -> None:
    machine = offloaded()
    many = machine.max_migrate_blocks + 1
    for i in range(3):
        assert step(machine, 1 + i * 0.01, free=CALM, live=many) == []
    assert "draining" in machine.reason
    actions = step(machine, 1.5, free=CALM, live=machine.max_migrate_blocks)
    assert isinstance(actions[0], StartContraction)
    plan = actions[0].plan
    assert plan.num_moved == machine.max_migrate_blocks
    assert all(m.source >= CAPACITY.num_base_blocks > m.destination for m in plan.moves)


def test_contraction_stops_waiting_for_the_drain_after_the_timeout() -> None:
    machine = offloaded()
    many = machine.max_migrate_blocks + 50
    for i in range(3):
        step(machine, 1 + i * 0.01, free=CALM, live=many)
    assert step(machine, 1 + PARAMS.drain_timeout_s - 0.1, free=CALM, live=many) == []
    actions = step(machine, 1 + PARAMS.drain_timeout_s + 0.1, free=CALM, live=many)
    assert isinstance(actions[0], StartContraction) and actions[0].plan.num_moved == many


def test_contraction_waits_while_too_few_free_blocks_below_the_region_can_take_the_live_ones() -> None:
    machine = offloaded()
    live = machine.max_migrate_blocks
    for i in range(3):
        actions = machine.step(MemoryStep(1 + i * 0.01, 0, 0, CALM, live), Layout(live, num_free_base=live - 1))
        assert actions == []
    assert machine.state is DraftState.OFFLOADED and f"{live - 1} free below it" in machine.reason
    actions = machine.step(MemoryStep(1.1, 0, 0, CALM, live), Layout(live, num_free_base=live))
    assert isinstance(actions[0], StartContraction) and actions[0].plan.num_moved == live


def reloading(machine: ResidencyMachine, t: float) -> None:
    for i in range(3):
        step(machine, t + i * 0.01, free=CALM)
    machine.contraction_done(t + 0.05)
    assert machine.state is DraftState.RELOADING


def test_a_failed_reload_leaves_the_draft_offloaded_with_the_pool_expanded_and_backs_off() -> None:
    machine = offloaded()
    reloading(machine, 1.0)
    actions = machine.reload_done(1.2, ok=False)
    assert actions == [ExpandPool(CAPACITY.num_draft_blocks, "reload failed")]
    assert machine.state is DraftState.OFFLOADED and not machine.draft_resident
    assert machine.num_kv_blocks_total == CAPACITY.num_expanded_blocks
    # Calm at once, but no new attempt before the backoff ends.
    for i in range(40):
        assert step(machine, 1.3 + i * 0.1, free=CALM) == []
    assert isinstance(step(machine, 1.2 + PARAMS.retry_s + 0.01, free=CALM)[0], StartContraction)


def test_the_backoff_doubles_per_consecutive_failure_and_resets_after_a_success() -> None:
    machine = offloaded()
    attempts = []
    t = 1.0
    for _ in range(4):
        while machine.state is DraftState.OFFLOADED:
            step(machine, t, free=CALM)
            t += 0.01
        attempts.append(t)
        machine.contraction_done(t)
        machine.reload_done(t, ok=False)
    gaps = [round(b - a, 1) for a, b in zip(attempts, attempts[1:], strict=False)]
    assert gaps == [5.0, 10.0, 20.0]  # capped at retry_max_s
    while machine.state is DraftState.OFFLOADED:
        step(machine, t, free=CALM)
        t += 0.01
    machine.contraction_done(t)
    machine.reload_done(t)
    offloaded(machine, t + 1)
    reloading(machine, t + 2)
    machine.reload_done(t + 2.1, ok=False)
    assert "retry after 5 s" in machine.reason


def test_a_failed_offload_keeps_the_draft_resident_and_backs_off() -> None:
    machine = ResidencyMachine(CAPACITY, PARAMS)
    for t in (0.0, 0.1, 0.2):
        step(machine, t)
    assert machine.offload_done(0.3, ok=False) == []
    assert machine.draft_resident and machine.num_kv_blocks_total == CAPACITY.num_base_blocks
    assert all(step(machine, 0.4 + i * 0.1) == [] for i in range(40))
    assert [type(a) for a in step(machine, 0.3 + PARAMS.retry_s + 0.01)] == [StartOffload]


def test_without_self_grant_the_machine_only_wants_until_granted() -> None:
    machine = ResidencyMachine(CAPACITY, PARAMS, self_grant=False)
    for t in (0.0, 0.1, 0.2, 0.3):
        assert step(machine, t) == []
    assert machine.offload_wanted and not machine.offload_granted
    machine.grant_offload()
    assert [type(a) for a in step(machine, 0.4)] == [StartOffload]
    machine.offload_done(0.5)
    for t in (1.0, 1.1, 1.2):
        assert step(machine, t, free=CALM) == []
    assert machine.reload_wanted and not machine.reload_granted
    machine.grant_reload()
    assert [type(a) for a in step(machine, 1.3, free=CALM)] == [StartContraction]


def test_a_want_and_its_grant_are_withdrawn_when_the_trigger_stops_holding() -> None:
    machine = offloaded(ResidencyMachine(CAPACITY, PARAMS, self_grant=False))
    for t in (1.0, 1.1, 1.2):
        step(machine, t, free=CALM)
    machine.grant_reload()
    step(machine, 1.3, free=CALM, waiting=3)  # a burst arrives before the machine acted
    assert not machine.reload_wanted and not machine.reload_granted
    assert machine.state is DraftState.OFFLOADED
    machine.grant_reload()  # a stale grant for a want that is gone does nothing
    assert not machine.reload_granted


def test_no_thrashing_when_load_flickers_faster_than_the_window() -> None:
    machine = ResidencyMachine(CAPACITY, PARAMS)
    # Pressure two steps out of three for a thousand steps: never W in a row.
    for i in range(1000):
        assert step(machine, i * 0.01, free=PRESSED if i % 3 else 500) == []
    machine = offloaded()
    # Offloaded, and the queue empties two steps out of three.
    for i in range(1000):
        assert step(machine, 1 + i * 0.01, free=CALM, waiting=0 if i % 3 else 2) == []
    assert machine.state is DraftState.OFFLOADED


def test_no_thrashing_when_load_sits_between_the_two_thresholds() -> None:
    # Free blocks that make the expanded pool just too full to reload are, once the draft is back, still above the
    # offload threshold: a load in that band moves the machine in neither direction (hysteresis).
    machine = offloaded()
    band = machine.reload_free_blocks - 1
    assert band - CAPACITY.num_draft_blocks >= machine.low_free_blocks
    for i in range(500):
        assert step(machine, 1 + i * 0.01, free=band) == []
    machine = ResidencyMachine(CAPACITY, PARAMS)
    for i in range(500):
        assert step(machine, i * 0.01, free=band - CAPACITY.num_draft_blocks) == []


def test_a_revoked_grant_stops_a_contraction_that_was_waiting_for_the_drain() -> None:
    machine = offloaded(ResidencyMachine(CAPACITY, PARAMS, self_grant=False))
    many = machine.max_migrate_blocks + 1
    for t in (1.0, 1.1, 1.2):
        step(machine, t, free=CALM, live=many)
    machine.grant_reload()
    assert step(machine, 1.3, free=CALM, live=many) == []  # granted, draining
    machine.revoke_reload()
    # Past the drain timeout, but without a grant the machine only keeps wanting.
    assert step(machine, 1.3 + PARAMS.drain_timeout_s + 1, free=CALM, live=many) == []
    assert machine.reload_wanted and not machine.reload_granted and machine.state is DraftState.OFFLOADED


# -- the dwell after a reload (min_resident_s) ----------------------------------------------------------------

DWELL = replace(PARAMS, min_resident_s=2.0)


def resident_again(machine: ResidencyMachine, t: float) -> float:
    """Offload, then reload with the reload finishing at the returned time."""
    offloaded(machine, t)
    reloading(machine, t + 1.0)
    assert machine.reload_done(t + 1.1) == [] and machine.draft_resident
    return t + 1.1


def test_a_dwell_holds_back_an_offload_whose_trigger_held_w_steps_after_a_reload() -> None:
    machine = ResidencyMachine(CAPACITY, DWELL)
    done_s = resident_again(machine, 0.0)
    for i in range(10 * PARAMS.window_steps):
        assert step(machine, done_s + 0.01 + i * 0.01) == []
    assert machine.state is DraftState.RESIDENT and not machine.offload_wanted
    assert "dwell after a reload" in machine.reason and f"{DWELL.min_resident_s:g} s" in machine.reason


def test_the_offload_fires_at_the_first_step_at_or_after_the_dwells_end_when_pressure_persisted() -> None:
    machine = ResidencyMachine(CAPACITY, DWELL)
    done_s = resident_again(machine, 0.0)
    end_s = done_s + DWELL.min_resident_s
    times = [done_s + 0.3 * i for i in range(1, 20)]
    fired = [t for t in times if step(machine, t)]
    assert fired == [min(t for t in times if t >= end_s)]
    assert machine.state is DraftState.OFFLOADING


def test_pressure_that_starts_near_the_dwells_end_still_needs_its_w_steps() -> None:
    machine = ResidencyMachine(CAPACITY, DWELL)
    end_s = resident_again(machine, 0.0) + DWELL.min_resident_s
    steps = [end_s - 0.01 + i * 0.01 for i in range(PARAMS.window_steps)]
    assert all(step(machine, t) == [] for t in steps[:-1])
    assert [type(a) for a in step(machine, steps[-1])] == [StartOffload]


def test_the_initial_resident_state_has_no_dwell() -> None:
    machine = ResidencyMachine(CAPACITY, replace(PARAMS, min_resident_s=1e6))
    actions = [step(machine, i * 0.01) for i in range(PARAMS.window_steps)]
    assert [type(a) for a in actions[-1]] == [StartOffload]


def test_no_dwell_offloads_again_w_steps_after_a_reload() -> None:
    machine = ResidencyMachine(CAPACITY, PARAMS)
    assert PARAMS.min_resident_s == 0.0
    done_s = resident_again(machine, 0.0)
    actions = [step(machine, done_s + 0.01 * (i + 1)) for i in range(PARAMS.window_steps)]
    assert [type(a) for a in actions[-1]] == [StartOffload]


def test_the_dwell_runs_from_the_reload_that_succeeded_not_from_a_failed_one() -> None:
    machine = ResidencyMachine(CAPACITY, DWELL)
    offloaded(machine)
    reloading(machine, 1.0)
    machine.reload_done(1.1, ok=False)
    t = 1.1 + PARAMS.retry_s
    while machine.state is DraftState.OFFLOADED:
        step(machine, t, free=CALM)
        t += 0.01
    machine.contraction_done(t)
    machine.reload_done(t + 0.1)
    end_s = t + 0.1 + DWELL.min_resident_s
    times = [t + 0.1 + 0.25 * i for i in range(1, 20)]
    fired = [s for s in times if step(machine, s)]
    assert fired == [min(s for s in times if s >= end_s)]


def test_a_failed_offload_backs_off_as_before_with_no_dwell() -> None:
    machine = ResidencyMachine(CAPACITY, replace(PARAMS, min_resident_s=10 * PARAMS.retry_s))
    for t in (0.0, 0.1, 0.2):
        step(machine, t)
    machine.offload_done(0.3, ok=False)
    assert "retry after" in machine.reason
    assert all(step(machine, 0.4 + i * 0.1) == [] for i in range(40))
    assert [type(a) for a in step(machine, 0.3 + PARAMS.retry_s + 0.01)] == [StartOffload]


def cycles_under_oscillation(params: ResidencyParams) -> tuple[int, list[float]]:
    """Offloads over an oscillating load (W + 7 steps busy, as many calm) with instant transfers, and how long the
    draft stayed resident before each re-offload."""
    machine = ResidencyMachine(CAPACITY, params)
    half = PARAMS.window_steps + 7
    resident_s: float | None = None
    offloads, stays = 0, []
    for i in range(2000):
        t = i * 0.01
        busy = (i // half) % 2 == 0
        for action in step(machine, t, free=PRESSED if busy else CALM, waiting=5 if busy else 0):
            if isinstance(action, StartOffload):
                offloads += 1
                if resident_s is not None:
                    stays.append(t - resident_s)
                machine.offload_done(t)
            elif isinstance(action, StartContraction):
                machine.contraction_done(t)
                machine.reload_done(t)
                resident_s = t
    return offloads, stays


def test_an_oscillating_load_cycles_less_with_a_dwell() -> None:
    without, _ = cycles_under_oscillation(PARAMS)
    with_dwell, stays = cycles_under_oscillation(replace(PARAMS, min_resident_s=0.5))
    assert 1 < with_dwell < without
    assert stays and min(stays) >= 0.5
