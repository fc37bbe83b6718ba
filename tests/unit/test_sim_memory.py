"""Draft offload and reload in the simulator (specserve.sim.draft_memory): Nightjar §6 on simulated replicas.

Small bursty scenarios on Nightjar's 7B pair (RTX 4090) with a 1,200-block pool, so the burst fills the cache in a
few seconds of virtual time and a run takes a fraction of a second.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from specserve.memory import DraftState
from specserve.sim import parse_scenario
from specserve.sim.kernel import SimResult
from specserve.sim.runner import simulate
from specserve.sim.scenario import resolve
from specserve.sim.steps import StepStats
from specserve.sim.transfers import TransferLink
from specserve.speculation import Decision, EngineTraits, Policy, StepContext, StepRecord


def scenario(peak_qps: float = 20.0, num_replicas: int = 1, arrivals: dict | None = None, **memory: Any):
    burst = {"kind": "burst", "base_qps": 1.0, "peak_qps": peak_qps, "burst_start_s": 3, "burst_duration_s": 6}
    return parse_scenario(
        {
            "name": "memory",
            "hardware": "rtx4090",
            "pair": "deepseek-r1-distill-qwen-7b+0.5b",
            "num_replicas": num_replicas,
            "engine": {"max_k": 4, "num_kv_blocks": 1200, "max_model_len": 1024, "k0_runs_draft_pass": False},
            "workload": {
                "lengths": {
                    "prompt_tokens": {"mean": 200, "std": 100, "max_tokens": 600},
                    "output_tokens": {"mean": 150, "std": 80, "max_tokens": 400},
                },
                "arrivals": {**(arrivals or burst), "duration_s": 16},
            },
            "acceptance": {"mean": 0.66},
            "memory": {"offload": True, **memory},
        }
    )


def run(scen, policy: Any = "bandit") -> tuple[SimResult, list[tuple[StepRecord, StepStats]]]:
    steps: list[tuple[StepRecord, StepStats]] = []
    result = simulate(scen, policy, seed=0, on_step=lambda record, stats: steps.append((record, stats)))
    assert result.memory is not None
    return result, steps


def test_a_light_load_never_offloads() -> None:
    result, _ = run(scenario(peak_qps=2.0))
    assert result.memory is not None and result.memory.changes == []


def test_offload_follows_w_steps_at_k0_under_kv_pressure_and_grows_the_pool_by_the_drafts_blocks() -> None:
    scen = scenario()
    result, steps = run(scen)
    memory, resolved = result.memory, resolve(scen)
    assert memory is not None
    offload_s = next(c.time_s for c in memory.changes if c.state is DraftState.OFFLOADING)
    before = [(r, s) for r, s in steps if r.now_s + r.duration_s <= offload_s + 1e-12][-scen.memory.window_steps :]
    eta_blocks = scen.memory.low_free_ratio * resolved.num_kv_blocks
    assert all(r.k == 0 and s.num_kv_blocks_total - s.num_kv_blocks_used < eta_blocks for r, s in before)
    totals = {s.num_kv_blocks_total for _, s in steps}
    assert totals == {resolved.num_kv_blocks, resolved.num_kv_blocks + resolved.num_draft_weight_blocks}
    # The expanded pool was used: more blocks held at once than the baseline has.
    assert max(s.num_kv_blocks_used for _, s in steps) > resolved.num_kv_blocks


def test_no_request_is_lost_across_offload_and_reload() -> None:
    result, _ = run(scenario(num_replicas=2, peak_qps=40.0))
    assert result.memory is not None and result.memory.reloads  # requests lived through a whole cycle
    table = result.table
    assert np.isfinite(table.finish_s).all()
    assert (table.num_output == table.output_tokens).all()


@dataclass(frozen=True, slots=True)
class NoParams:
    pass


class GreedyWhenRoomy(Policy):
    """Speculates (k = 4) whenever a fifth of the pool is free and ignores draft residency: the replica must force
    k = 0 while the draft is away."""

    name = "greedy-when-roomy"
    Params = NoParams

    def __init__(self, traits: EngineTraits, contexts: list[StepContext]) -> None:
        super().__init__(NoParams(), traits)
        self.contexts = contexts

    def choose(self, ctx: StepContext) -> Decision:
        self.contexts.append(ctx)
        return Decision(k=4 if ctx.num_kv_blocks_free > ctx.num_kv_blocks_total // 5 else 0)


def test_speculation_is_forced_off_while_the_draft_is_not_resident() -> None:
    contexts: list[StepContext] = []
    result, steps = run(scenario(), lambda traits: GreedyWhenRoomy(traits, contexts))
    assert len(contexts) == len(steps)
    away = [r.k for ctx, (r, _) in zip(contexts, steps, strict=True) if not ctx.draft_resident]
    roomy_away = [
        ctx for ctx in contexts if not ctx.draft_resident and ctx.num_kv_blocks_free > ctx.num_kv_blocks_total // 5
    ]
    assert away and roomy_away  # the policy asked for k = 4 while the draft was away ...
    assert set(away) == {0}  # ... and got none
    resident = [r.k for ctx, (r, _) in zip(contexts, steps, strict=True) if ctx.draft_resident]
    assert 4 in resident


def test_a_reloaded_draft_catches_up_over_the_whole_context() -> None:
    result, steps = run(scenario())
    memory, timer = result.memory, result.replicas[0].timer
    assert memory is not None and memory.reloads
    back_s = memory.reloads[0].resident_s
    assert back_s is not None
    record = next(r for r, _ in steps if r.now_s >= back_s and r.num_draft_passes > 0)
    # Price the step as if the draft were in sync: its first pass reads only the step's new tokens.
    drafted = record.num_drafted_per_request
    further = [sum(d >= j for d in drafted) for j in range(2, record.num_draft_passes + 1)]
    new_tokens = record.num_batched_tokens - record.num_drafted
    in_sync_s = timer.step_s(record.num_context_tokens, record.num_batched_tokens, [new_tokens, *further])
    # The draft re-reads whole contexts: hundreds of tokens per request it catches up on.
    hundred_tokens_s = timer.draft.forward_s(0, 100) - timer.draft.forward_s(0, 0)
    assert record.duration_s > in_sync_s + hundred_tokens_s


def drafting_after_reload(scen: Any) -> list[float]:
    """The share of running requests that drafted, in each of the first 30 steps at k > 0 after the reload."""
    result, steps = run(scen)
    memory = result.memory
    assert memory is not None and memory.reloads and memory.reloads[0].resident_s is not None
    back_s = memory.reloads[0].resident_s
    return [len(r.num_drafted_per_request) / r.num_running for r, _ in steps if r.now_s >= back_s and r.k > 0][:30]


@pytest.mark.parametrize("drafts_ahead", [False, True])
def test_a_catch_up_cap_spreads_a_reload_over_steps_and_lagging_requests_draft_nothing(drafts_ahead: bool) -> None:
    base = scenario()
    engine = base.engine.model_copy(update={"drafts_ahead": drafts_ahead})
    uncapped = drafting_after_reload(base.model_copy(update={"engine": engine}))
    capped_engine = engine.model_copy(update={"catch_up_max_tokens": 300})
    capped = drafting_after_reload(base.model_copy(update={"engine": capped_engine}))
    # Without a cap the token budget holds (nearly) every request's whole context: they draft at once. With one,
    # requests join a few at a time, and whoever has not caught up yet drafts nothing meanwhile.
    assert max(uncapped[:2]) >= 0.9
    assert max(capped[:2]) < 0.5
    assert max(capped) == 1.0


def test_reloading_sets_every_running_requests_draft_lag_to_its_whole_context() -> None:
    result, _ = run(scenario(peak_qps=2.0))
    replica = result.replicas[0]
    replica.batch.extend([0, 1, 2], result.table)
    replica.batch.num_computed[:] = [300, 40, 0]
    replica.batch.draft_lag[:] = [5, 0, 0]  # request 0 had skipped some steps before
    replica.draft_reloaded()
    # Each lags by its cached tokens plus the step's own (the catch-up prepends all but the last).
    assert replica.batch.draft_lag.tolist() == [301, 41, 1]


def test_concurrent_copies_share_the_link() -> None:
    alone, shared = TransferLink(1e9), TransferLink(1e9)
    alone.add(0.0, 0, 1e8)
    for owner in range(4):
        shared.add(0.0, owner, 1e8)
    assert alone.next_done_s() == pytest.approx(0.1)
    assert shared.next_done_s() == pytest.approx(0.4)
    assert shared.pop_done(0.39) == [] and shared.pop_done(0.4) == [0, 1, 2, 3]


def test_a_copy_speeds_up_when_another_finishes() -> None:
    link = TransferLink(1e9)
    link.add(0.0, 0, 1e8)
    link.add(0.0, 1, 3e8)
    assert link.pop_done(0.2) == [0]  # 0.1 GB each at half the link
    assert link.next_done_s() == pytest.approx(0.4)  # 0.2 GB left at the whole link


def reload_spans(result: SimResult) -> list[tuple[float, float]]:
    """Per reload, [pool shrinks, draft resident]: the interval holding a transfer slot."""
    assert result.memory is not None
    return [(r.contraction_s, r.resident_s or np.inf) for r in result.memory.reloads]


def max_overlap(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    depth = peak = 0
    for _, delta in edges:
        depth += delta
        peak = max(peak, depth)
    return peak


def test_contention_lengthens_reloads_that_overlap_on_one_node() -> None:
    # Zero device-local time, so each reload span is its copy alone.
    scen = scenario(num_replicas=4, peak_qps=80.0, replicas_per_node=4, contract_s=0.0, drain_timeout_s=0.0)
    result, _ = run(scen)
    spans = reload_spans(result)
    assert max_overlap(spans) >= 2
    alone_s = resolve(scen).draft.weight_bytes / (resolve(scen).hardware.host_to_device_gb_s * 1e9)
    # Sharing the node's link, a reload that overlaps another takes longer than its copy alone; one that overlaps
    # none takes exactly that.
    for i, (a, b) in enumerate(spans):
        overlaps = any(c < b and a < d for j, (c, d) in enumerate(spans) if j != i)
        assert (b - a > alone_s * (1 + 1e-9)) if overlaps else (b - a == pytest.approx(alone_s))
    one_per_node, _ = run(scenario(num_replicas=4, peak_qps=80.0, contract_s=0.0, drain_timeout_s=0.0))
    assert max(b - a for a, b in reload_spans(one_per_node)) == pytest.approx(alone_s)


def test_the_planner_caps_concurrent_reloads_per_node() -> None:
    common = {"num_replicas": 4, "peak_qps": 80.0, "replicas_per_node": 4, "contract_s": 0.0, "drain_timeout_s": 0.0}
    local, _ = run(scenario(**common))
    planned, _ = run(scenario(**common, coordination="planner", max_concurrent_transfers=1))
    assert max_overlap(reload_spans(local)) >= 2
    assert max_overlap(reload_spans(planned)) == 1
    assert len(reload_spans(planned)) == len(reload_spans(local))


def most_away_at_once(result: SimResult) -> int:
    """The most replicas whose draft was not resident at the same time."""
    assert result.memory is not None
    away: set[int] = set()
    most = 0
    for change in result.memory.changes:  # in time order
        (away.discard if change.state is DraftState.RESIDENT else away.add)(change.replica)
        most = max(most, len(away))
    return most


def test_the_planner_keeps_the_floor_of_resident_drafts() -> None:
    common = {"num_replicas": 4, "peak_qps": 80.0, "replicas_per_node": 4, "coordination": "planner"}
    assert most_away_at_once(run(scenario(**common))[0]) > 1
    floored, _ = run(scenario(**common, min_resident=3))
    assert most_away_at_once(floored) == 1


def test_without_offload_the_draft_stays_and_the_pool_keeps_its_size() -> None:
    scen = scenario()
    scen = scen.model_copy(update={"memory": scen.memory.model_copy(update={"offload": False})})
    steps: list[StepStats] = []
    result = simulate(scen, "bandit", seed=0, on_step=lambda _, stats: steps.append(stats))
    assert result.memory is None
    assert {s.num_kv_blocks_total for s in steps} == {resolve(scen).num_kv_blocks}


def resident_stretches(result: SimResult) -> list[float]:
    """Per replica, from each reload finishing to the next offload starting."""
    assert result.memory is not None
    stretches = []
    for replica in range(result.resolved.scenario.num_replicas):
        changes = [c for c in result.memory.changes if c.replica == replica]
        stretches += [
            b.time_s - a.time_s
            for a, b in zip(changes, changes[1:], strict=False)
            if (a.state, b.state) == (DraftState.RESIDENT, DraftState.OFFLOADING)
        ]
    return stretches


def test_the_scenarios_dwell_keeps_a_reloaded_draft_resident_that_long() -> None:
    # Load swings back soon after each reload: without a dwell the draft is offloaded again within seconds.
    oscillation = {"kind": "oscillation", "high_qps": 20.0, "low_qps": 0.0, "period_s": 6.0}
    undwelt = resident_stretches(run(scenario(arrivals=oscillation))[0])
    dwell_s = 1.5 * min(undwelt)
    dwelt = resident_stretches(run(scenario(arrivals=oscillation, min_resident_s=dwell_s))[0])
    assert dwelt and min(dwelt) >= dwell_s


def test_a_negative_dwell_is_rejected_naming_the_field() -> None:
    with pytest.raises(ValueError, match="min_resident_s"):
        scenario(min_resident_s=-1.0)
