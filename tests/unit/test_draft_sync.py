"""The k = 0 skip rule and the draft-KV bookkeeping (specserve.speculation.draft_sync)."""

from __future__ import annotations

import pytest

from specserve.speculation.draft_sync import (
    CPU_CATCH_UP_MAX_TOKENS,
    DraftKVTracker,
    DraftPassPlan,
    ScheduledRequest,
    catch_up_plan,
    is_partial,
    plan_step,
    skips_draft_pass,
)


def skips(k=0, new=0, tokens=(1, 1), enabled=True):
    return skips_draft_pass(enabled=enabled, k=k, num_new_requests=new, num_scheduled_tokens=tokens)


def test_only_pure_k0_decode_steps_skip():
    assert skips()
    assert skips(tokens=iter([1]))  # any iterable, e.g. a dict's values
    assert not skips(enabled=False)
    assert not skips(k=1)
    assert not skips(new=1)  # a new or resumed request is prefilled: the draft must see it
    assert not skips(tokens=(1, 7))  # a chunked prefill continues
    assert not skips(tokens=(2,))  # verification tokens or a recompute
    assert not skips(tokens=())  # an empty step runs nothing and is not a skip


def step(tracker, skipped, *requests):
    tracker.observe_step(skipped, [ScheduledRequest(*r) for r in requests])


def test_a_single_skipped_step_leaves_no_hole():
    t = DraftKVTracker()
    step(t, False, ("r", 0, 10, True))  # prefill of 10 tokens; the pass also wrote the sampled token at 10
    assert t.draft_upto["r"] == 11 and not t.lagging("r", 10)
    step(t, True, ("r", 10, 11, True))  # skipped: position 10 was written already
    assert not t.lagging("r", 11)
    step(t, False, ("r", 11, 12, True))  # the next pass starts inside the complete prefix
    assert t.draft_upto["r"] == 13 and not t.lagging("r", 12)


def test_two_skipped_steps_leave_a_hole_until_caught_up():
    t = DraftKVTracker()
    step(t, False, ("r", 0, 10, True))
    step(t, True, ("r", 10, 11, True))
    step(t, True, ("r", 11, 12, True))
    assert t.lagging("r", 12)  # position 11 was never written
    step(t, False, ("r", 12, 15, True))  # a pass that does not catch it up does not fill it
    assert t.lagging("r", 15)


def test_a_caught_up_request_is_complete_again_and_its_lag_is_the_hole():
    t = DraftKVTracker()
    step(t, False, ("r", 0, 10, True))
    for i in range(4):  # four skipped steps: positions 11, 12, 13 never written
        step(t, True, ("r", 10 + i, 11 + i, True))
    assert t.lag("r", 14) == 3
    t.observe_step(False, [ScheduledRequest("r", 14, 19, True)], caught_up={"r": 3})
    assert not t.lagging("r", 19) and t.lag("r", 19) == 0


def test_a_lag_longer_than_the_room_is_caught_up_in_chunks_until_it_fits():
    t = DraftKVTracker()
    step(t, False, ("r", 0, 10, True))
    for i in range(40):  # forty skipped steps: positions 11-49 never written (39)
        step(t, True, ("r", 10 + i, 11 + i, True))
    start, steps = 50, 0
    while t.lagging("r", start):
        lags = {"r": t.lag("r", start)}
        plan = catch_up_plan(lags, room=16)
        assert plan, "every step catches something up"
        # A chunk's pass leaves out the step's own token, which joins the lag.
        t.observe_step(False, [ScheduledRequest("r", start, start + 1, True)], caught_up=plan)
        start, steps = start + 1, steps + 1
    assert steps == 3  # 39 missed: two chunks of 16 (each step's own token joins the lag), then the last 9 whole
    assert t.lag("r", start) == 0


def test_the_catch_up_plan_takes_short_lags_first_within_the_room_and_splits_only_one_that_never_fits():
    lags = {"a": 5, "b": 0, "c": 2, "d": 9, "e": 2}
    assert catch_up_plan(lags, room=100) == {"c": 2, "e": 2, "a": 5, "d": 9}
    assert catch_up_plan(lags, room=10) == {"c": 2, "e": 2, "a": 5}
    assert catch_up_plan(lags, room=3) == {"c": 2}
    # The shortest lag does not fit: its first positions go, as many as the room holds.
    assert catch_up_plan(lags, room=1) == {"c": 1}
    assert is_partial({"c": 1}, lags, "c") and not is_partial({"c": 2}, lags, "c")
    assert catch_up_plan(lags, room=0) == {}
    # The same plan whatever order the batch is held in (worker and scheduler differ).
    assert catch_up_plan(dict(reversed(list(lags.items()))), room=10) == catch_up_plan(lags, room=10)


def test_the_catch_up_cap_spreads_a_reload_over_steps_and_never_starves_a_long_lag():
    lags = {"a": 5, "c": 2, "d": 9, "e": 2}
    assert catch_up_plan(lags, room=100, max_tokens=9) == {"c": 2, "e": 2, "a": 5}
    assert catch_up_plan(lags, room=100, max_tokens=4) == {"c": 2, "e": 2}
    # A lag above the cap still goes when it is the shortest and the room holds it, alone.
    assert catch_up_plan({"d": 9, "f": 12}, room=100, max_tokens=4) == {"d": 9}
    assert catch_up_plan({"d": 9}, room=8, max_tokens=4) == {"d": 4}  # too long for the room: a capped chunk
    # Steps in a row: every lagging request is caught up, none in a step over the cap but the first.
    left, steps = dict(lags), 0
    while left:
        plan = catch_up_plan(left, room=100, max_tokens=6)
        assert plan and (len(plan) == 1 or sum(plan.values()) <= 6)
        left = {r: n for r, n in left.items() if r not in plan}
        steps += 1
    assert steps == 3  # {c, e}, {a}, {d}


def test_partial_prefill_and_preemption():
    t = DraftKVTracker()
    step(t, False, ("r", 0, 8, False))  # a partial chunk samples nothing: only [0, 8) is written
    assert t.draft_upto["r"] == 8 and not t.lagging("r", 8)
    step(t, True, ("r", 8, 9, True))  # a last chunk of one token in a skipped step: conservatively lagging
    assert t.lagging("r", 9)
    step(t, False, ("r", 0, 20, True))  # preempted and recomputed from position 0: complete again
    assert not t.lagging("r", 20)


def test_unknown_requests_lag_once_past_position_0_and_finished_ones_are_forgotten():
    t = DraftKVTracker()
    assert not t.lagging("new", 0)
    assert t.lagging("never-seen", 5)
    step(t, False, ("a", 0, 4, True), ("b", 0, 4, True))
    t.keep_only(["b"])
    assert list(t.draft_upto) == ["b"]


def test_a_request_entering_at_a_prefix_cache_hit_lags_over_its_whole_cached_prefix():
    # Worked example: a new request's prompt of 300 tokens hits two cached KV blocks of 128; the step computes
    # positions [256, 300). Whoever filled those blocks may have skipped the draft's passes over them.
    t = DraftKVTracker()
    t.forget(["new"])
    assert t.lag("new", 256) == 256
    plan = catch_up_plan({"new": t.lag("new", 256)}, room=1000)
    t.observe_step(False, [ScheduledRequest("new", 256, 300, True)], plan)
    assert plan == {"new": 256} and t.draft_upto["new"] == 301 and not t.lagging("new", 300)
    # Preempted at 320 and resumed at a hit on its first two blocks, which another request may have refilled since:
    # what this request's own passes wrote no longer says anything about them.
    step(t, False, ("new", 300, 320, True), ("other", 0, 4, True))
    assert t.lag("new", 256) == 0  # kept, the old prefix would pass the hit as complete
    t.forget(["new"])
    assert t.lag("new", 256) == 256 and t.draft_upto == {"other": 5}


@pytest.mark.parametrize("run", range(0, 6))
def test_a_run_of_m_skipped_steps_leaves_m_minus_1_holes(run):
    t = DraftKVTracker()
    step(t, False, ("r", 0, 10, True))
    for i in range(run):
        step(t, True, ("r", 10 + i, 11 + i, True))
    assert t.lagging("r", 10 + run) == (run >= 2)


def test_both_engine_sides_read_one_switch_from_the_engine_config():
    from types import SimpleNamespace

    from specserve.replicas.config.engine_args import EngineSpec, speculative_engine_kwargs
    from specserve.replicas.k0_skip import skipping_enabled, step_skips_draft_pass

    def config(skip, async_scheduling=False, speculative=True):
        kwargs = speculative_engine_kwargs(
            EngineSpec(target="t", draft="d", policy="fixed:k=0", max_k=4, skip_k0_draft_pass=skip)
        )
        assert kwargs["worker_extension_cls"] == "specserve.replicas.worker.extension.InstalledWorkerExtension"
        return SimpleNamespace(
            additional_config=kwargs["additional_config"],
            speculative_config=SimpleNamespace(**kwargs["speculative_config"]) if speculative else None,
            scheduler_config=SimpleNamespace(async_scheduling=async_scheduling),
        )

    assert skipping_enabled(config(True))
    assert not skipping_enabled(config(False))
    assert not skipping_enabled(config(True, async_scheduling=True))
    assert not skipping_enabled(config(True, speculative=False))
    assert not skipping_enabled(SimpleNamespace(additional_config=None, speculative_config=object()))

    def output(k, new=(), resumed=(), tokens=None):
        return SimpleNamespace(
            num_spec_tokens_to_schedule=k,
            scheduled_new_reqs=list(new),
            scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=set(resumed)),
            num_scheduled_tokens=tokens if tokens is not None else {"a": 1, "b": 1},
        )

    assert step_skips_draft_pass(True, output(0))
    assert not step_skips_draft_pass(False, output(0))
    assert not step_skips_draft_pass(True, output(2))
    assert not step_skips_draft_pass(True, output(0, new=["c"]))
    assert not step_skips_draft_pass(True, output(0, resumed=["a"]))
    assert not step_skips_draft_pass(True, output(0, tokens={"a": 1, "b": 5}))


def test_while_the_draft_is_offloaded_every_step_with_tokens_skips_its_pass_prefills_too():
    prefill = dict(enabled=True, k=0, num_new_requests=2, num_scheduled_tokens=[30, 12])
    assert not skips_draft_pass(**prefill)
    assert skips_draft_pass(**prefill, draft_resident=False)
    assert skips_draft_pass(enabled=True, k=0, num_new_requests=0, num_scheduled_tokens=[1, 1], draft_resident=False)
    assert not skips_draft_pass(enabled=True, k=0, num_new_requests=0, num_scheduled_tokens=[], draft_resident=False)


def test_the_offload_triggers_reach_the_engine_through_its_config():
    from specserve.replicas.config.engine_args import (
        DraftOffload,
        EngineControlConfig,
        EngineSpec,
        speculative_engine_kwargs,
    )

    def control(offload):
        kwargs = speculative_engine_kwargs(
            EngineSpec(target="t", draft="d", policy="adaptive", max_k=4, draft_offload=offload)
        )
        return EngineControlConfig.from_additional_config(kwargs["additional_config"]["specserve"])

    assert control(None).draft_offload is None
    assert control(DraftOffload(0.2, 5)).draft_offload == DraftOffload(0.2, 5)


@pytest.mark.parametrize(
    ("configured", "device", "cap"),
    [(None, "cpu", CPU_CATCH_UP_MAX_TOKENS), (None, "cuda", None), (64, "cuda", 64), (4096, "cpu", 4096)],
)
def test_the_catch_up_cap_comes_from_the_engine_config(configured, device, cap):
    from types import SimpleNamespace

    from specserve.replicas.config.engine_args import EngineSpec, speculative_engine_kwargs
    from specserve.replicas.k0_skip import catch_up_cap

    kwargs = speculative_engine_kwargs(
        EngineSpec(target="t", draft="d", policy="fixed:k=0", max_k=4, catch_up_max_tokens=configured)
    )
    vllm_config = SimpleNamespace(
        additional_config=kwargs["additional_config"], device_config=SimpleNamespace(device_type=device)
    )
    assert catch_up_cap(vllm_config) == cap


def test_the_scheduler_plans_each_pass_once_whom_it_catches_up_from_where():
    tracker = DraftKVTracker()
    tracker.observe_step(False, [ScheduledRequest("a", 0, 10, True), ScheduledRequest("b", 0, 40, True)])
    # a: complete up to 11, lags 4 at 15; b: complete up to 41, lags 59 at 100, more than the room's 20.
    plan = plan_step(skip=False, starts={"a": 15, "b": 100}, tracker=tracker, room=20, max_tokens=None)
    assert plan == DraftPassPlan(skip=False, catch_up={"a": 4}, first_stale={"a": 11}, partial=frozenset())
    plan = plan_step(skip=False, starts={"b": 100}, tracker=tracker, room=20, max_tokens=None)
    assert plan == DraftPassPlan(skip=False, catch_up={"b": 20}, first_stale={"b": 41}, partial=frozenset({"b"}))
    assert plan_step(skip=True, starts={"a": 15}, tracker=tracker, room=20, max_tokens=None) == DraftPassPlan(skip=True)


def test_the_plan_reaches_the_worker_on_the_scheduler_output_pickled_as_the_mp_and_ray_executors_send_it():
    import pickle

    from vllm.v1.core.sched.output import SchedulerOutput

    from specserve.replicas.signalled_drafts import UNPLANNED, attach_plan, step_plan

    output = SchedulerOutput.make_empty()
    assert step_plan(output) is UNPLANNED and not UNPLANNED.skip  # not our scheduler: vLLM's own pass
    plan = DraftPassPlan(skip=False, catch_up={"a": 4}, first_stale={"a": 11}, partial=frozenset({"a"}))
    attach_plan(output, plan)
    assert step_plan(pickle.loads(pickle.dumps(output, protocol=pickle.HIGHEST_PROTOCOL))) == plan
