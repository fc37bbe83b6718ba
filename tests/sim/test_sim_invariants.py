"""Simulator invariants: tokens conserved, KV within capacity, emitted = accepted + sampled, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sim_helpers import recording_policy, small_scenario

from specserve.sim import StepStats, simulate, summarize
from specserve.speculation import StepContext, StepRecord, policy_names

POLICIES = ("fixed:k=0", "fixed:k=3", "adaptive", "cycle:ks=0-4-1")


def run_logged(scenario, policy, seed=0):
    steps: list[tuple[StepRecord, StepStats]] = []
    result = simulate(scenario, policy, seed, on_step=lambda record, stats: steps.append((record, stats)))
    return result, steps


@pytest.mark.parametrize("policy", POLICIES)
def test_every_request_emits_exactly_its_output_length(policy: str) -> None:
    result, steps = run_logged(small_scenario(), policy)
    table = result.table
    assert len(table.arrival_s) > 20
    assert np.array_equal(table.num_output, table.output_tokens)
    assert not np.isnan(table.finish_s).any()
    assert (table.first_token_s >= table.arrival_s).all()
    assert (table.finish_s >= table.first_token_s).all()


@pytest.mark.parametrize("policy", POLICIES)
def test_kv_never_over_capacity_and_all_freed(policy: str) -> None:
    result, steps = run_logged(small_scenario(engine={"num_kv_blocks": 96}), policy)
    assert all(0 <= stats.num_kv_blocks_used <= stats.num_kv_blocks_total == 96 for _, stats in steps)
    # Everything finished, so every block is back.
    assert steps[-1][1].num_kv_blocks_used == 0
    assert result.replicas[0].num_kv_blocks_free == 96


@pytest.mark.parametrize("policy", POLICIES)
def test_emitted_is_accepted_plus_one_per_sampled_request(policy: str) -> None:
    _, steps = run_logged(small_scenario(), policy)
    for record, stats in steps:
        assert record.num_emitted_tokens == record.num_accepted + stats.num_sampled
        assert stats.num_sampled <= record.num_running
        assert all(
            0 <= a <= d <= record.k
            for d, a in zip(record.num_drafted_per_request, record.num_accepted_per_request, strict=True)
        )
        assert record.duration_s > 0


def test_records_time_their_parts_as_the_engine_does() -> None:
    _, steps = run_logged(small_scenario(engine={"k0_runs_draft_pass": False}), "cycle:ks=0-3-1")
    for record, _ in steps:
        assert record.forward_s is not None and record.draft_s is not None
        assert 0 < record.forward_s <= record.duration_s
        # The draft's time is there exactly when its passes ran; what is left is the step's own overhead (none in
        # this profile, whose forward fit holds it).
        assert (record.draft_s > 0) == (record.num_draft_passes > 0)
        assert record.duration_s - record.forward_s - record.draft_s == pytest.approx(0.0, abs=1e-12)
    three = [r.draft_s for r, _ in steps if r.num_draft_passes == 3 and r.num_batched_tokens == 4 * r.num_running]
    one = [r.draft_s for r, _ in steps if r.num_draft_passes == 1 and r.num_batched_tokens == 2 * r.num_running]
    assert three and one and min(three) > max(one)


def test_draft_passes_follow_k_and_the_k0_trait() -> None:
    _, synced = run_logged(small_scenario(), "cycle:ks=0-3")
    assert {(r.k, r.num_draft_passes) for r, _ in synced} <= {(0, 1), (3, 3), (3, 1)}
    _, skipped = run_logged(small_scenario(engine={"k0_runs_draft_pass": False}), "fixed:k=0")
    # As the engine does: pure decode steps skip the pass, a step that prefills runs it.
    decode_only = {r.num_draft_passes for r, _ in skipped if r.num_batched_tokens == r.num_running}
    with_prefill = {r.num_draft_passes for r, _ in skipped if r.num_batched_tokens > r.num_running}
    assert decode_only == {0} and with_prefill == {1}


def test_skipping_the_draft_at_k0_makes_it_catch_up_later() -> None:
    # Without the k=0 sync pass the draft misses tokens; its next pass re-reads all but the last of them
    # (Nightjar's switching cost), so the first speculative step after k=0 steps costs more than with the sync pass.
    durations = {}
    for synced in (True, False):
        _, steps = run_logged(small_scenario(engine={"k0_runs_draft_pass": synced}), "cycle:ks=0-0-0-0-2")
        durations[synced] = [r.duration_s for r, _ in steps if r.k == 2]
    assert sum(durations[False]) > sum(durations[True])


def tiny_kv_scenario():
    """Requests of 400 tokens arriving faster than a 40-block pool can hold them."""
    return small_scenario(
        engine={"num_kv_blocks": 40},
        workload={
            "lengths": {"prompt_tokens": {"mean": 200, "std": 0}, "output_tokens": {"mean": 200, "std": 0}},
            "arrivals": {"kind": "poisson", "rate_qps": 8, "duration_s": 5},
        },
    )


def test_tiny_kv_preempts_and_still_conserves_tokens() -> None:
    scenario = tiny_kv_scenario()
    result, steps = run_logged(scenario, "fixed:k=2")
    assert result.table.num_preemptions.sum() > 0
    assert sum(stats.num_preempted for _, stats in steps) == result.table.num_preemptions.sum()
    assert np.array_equal(result.table.num_output, result.table.output_tokens)
    assert max(stats.num_kv_blocks_used for _, stats in steps) <= 40


def test_fixed_zero_never_drafts() -> None:
    summary = summarize(simulate(small_scenario(), "fixed:k=0", 0))
    assert summary["acceptance"] == 0.0
    assert summary["mean_k"] == 0.0
    assert summary["k_switches"] == 0


def test_same_seed_same_result_and_another_seed_differs() -> None:
    def strip(summary: dict) -> dict:
        return {key: value for key, value in summary.items() if key != "wall_s"}

    first = simulate(small_scenario(), "adaptive", 7)
    second = simulate(small_scenario(), "adaptive", 7)
    assert strip(summarize(first)) == strip(summarize(second))
    assert first.replicas[0].series_k == second.replicas[0].series_k
    assert first.replicas[0].series_time_s == second.replicas[0].series_time_s
    other = summarize(simulate(small_scenario(), "adaptive", 8))
    assert strip(other) != strip(summarize(first))


def test_policies_see_the_same_requests() -> None:
    # The workload and per-request alphas come from streams no policy touches.
    a = simulate(small_scenario(), "fixed:k=0", 3)
    b = simulate(small_scenario(), "fixed:k=4", 3)
    assert np.array_equal(a.workload.arrival_s, b.workload.arrival_s)
    assert np.array_equal(a.table.alpha, b.table.alpha)


def test_several_replicas_share_the_load() -> None:
    result = simulate(small_scenario(num_replicas=3), "adaptive", 0)
    counts = np.bincount(result.table.replica, minlength=3)
    assert (counts > 0).all()
    assert np.array_equal(result.table.num_output, result.table.output_tokens)


def test_goodput_speculates_more_at_low_load_than_at_high_load() -> None:
    # RTX 4090, 7B target: short requests at 0.5 QPS leave the GPU memory-bound (drafts are nearly free), the
    # 40-60 QPS tail makes it compute-bound (every draft costs a target token). TurboSpec §8.1, Fig. 15a.
    segments = [{"duration_s": 15, "rate_qps": 0.5}] + [
        {"duration_s": 5, "rate_qps": q} for q in (5, 10, 20, 30, 40, 60)
    ]
    scenario = small_scenario(
        hardware="rtx4090",
        pair="deepseek-r1-distill-qwen-7b+0.5b",
        latency={"kind": "roofline"},
        engine={"max_k": 6},
        workload={
            "lengths": {"prompt_tokens": {"mean": 32, "std": 8}, "output_tokens": {"mean": 128, "std": 32}},
            "arrivals": {"kind": "piecewise", "segments": segments},
        },
        acceptance={"mean": 0.7, "concentration": None},
    )
    replica = simulate(scenario, "goodput:max_k=6", 0).replicas[0]
    time_s, ks = np.array(replica.series_time_s), np.array(replica.series_k)
    low, high = ks[time_s < 15].mean(), ks[(time_s > 35) & (time_s < 45)].mean()
    assert low > 2.5
    assert high < low - 1.0


def test_tpot_and_ttft_are_finite() -> None:
    summary = summarize(simulate(small_scenario(), "fixed:k=2", 0))
    for key in ("mean_e2e_s", "p99_e2e_s", "mean_ttft_s", "mean_tpot_s", "throughput_tok_s"):
        assert math.isfinite(summary[key]) and summary[key] > 0
    assert summary["goodput_tok_s"] == summary["throughput_tok_s"]  # no SLO: goodput is throughput
    assert summary["slo_attainment"] is None  # no TPOT SLO: nothing to attain


def test_slo_attainment_is_the_share_of_requests_within_the_tpot_slo() -> None:
    """AdaSpec's SLO attainment (§7.1, Fig. 11): per request TPOT = decode time / (tokens - 1) <= SLO.
    A TTFT cap does not enter it (goodput covers both)."""
    plain = simulate(small_scenario(), "fixed:k=0", 0)
    table = plain.table
    multi = table.output_tokens > 1
    tpot = (table.finish_s[multi] - table.first_token_s[multi]) / (table.output_tokens[multi] - 1)
    slo_s = float(np.median(tpot))
    result = simulate(small_scenario(slo={"max_tpot_s": slo_s, "max_ttft_s": 1e-6}), "fixed:k=0", 0)
    summary = summarize(result)
    assert summary["slo_attainment"] == pytest.approx(np.mean(tpot <= slo_s))
    assert 0.4 < summary["slo_attainment"] < 0.6 and summary["goodput_tok_s"] == 0.0  # the TTFT cap fails all
    assert summarize(simulate(small_scenario(slo={"max_ttft_s": 1.0}), "fixed:k=0", 0))["slo_attainment"] is None


@pytest.mark.parametrize("name", policy_names())
def test_every_registered_policy_runs_in_the_simulator(name: str) -> None:
    # The simulator drives the very policy objects the engine uses; each must finish a run with its defaults.
    result, steps = run_logged(small_scenario(), name)
    assert np.array_equal(result.table.num_output, result.table.output_tokens)
    assert all(record.k <= 4 for record, _ in steps)


def test_step_context_counts_only_the_prefill_that_can_run() -> None:
    # Overloaded with two seats: a long queue waits while both seats decode. The queue's prompts cannot join
    # such a step, so its context must not announce them (policies price k against the step's prefill).
    contexts: list[StepContext] = []
    scenario = small_scenario(
        engine={"max_num_seqs": 2}, workload={"arrivals": {"kind": "poisson", "rate_qps": 40, "duration_s": 2}}
    )
    result, steps = run_logged(scenario, recording_policy("fixed:k=0", contexts))
    assert result.policy_spec == "fixed:k=0"  # a factory's run is named by its policy's spec
    assert len(contexts) == len(steps)
    assert max(ctx.num_waiting for ctx in contexts) > 10
    for ctx, (record, _) in zip(contexts, steps, strict=True):
        assert ctx.num_prefill_tokens <= record.num_batched_tokens
    assert any(ctx.num_prefill_tokens > 0 for ctx in contexts)


def test_batch_expansion_rereads_the_kv_once_per_scored_position() -> None:
    # Same seed, same drafts and verdicts: only the price of verification differs (AdaSpec §4.1, Eq. 4).
    plain = run_logged(small_scenario(), "fixed:k=3")[1]
    expanded = run_logged(small_scenario(engine={"scorer": "batch_expansion"}), "fixed:k=3")[1]
    compared = 0
    for (a, _), (b, _) in zip(plain, expanded, strict=False):  # the runs may take different numbers of steps
        if (a.num_drafted_per_request, a.num_context_tokens) != (b.num_drafted_per_request, b.num_context_tokens):
            break  # slower steps let later arrivals join other steps: the runs part ways here
        compared += 1
        if a.num_drafted:
            assert b.duration_s > a.duration_s
        else:
            assert b.duration_s == a.duration_s
    assert compared > 50
    k0 = [run_logged(small_scenario(engine={"scorer": s}), "fixed:k=0")[1] for s in ("single_pass", "batch_expansion")]
    assert [r.duration_s for r, _ in k0[0]] == [r.duration_s for r, _ in k0[1]]


def test_an_offline_batch_announces_each_prompt_once() -> None:
    # Requests arrive at once for two seats. A waiting prompt may be announced only on the step that admits
    # it, so the announced prefill over the run adds up to the prompts, as on the real engine
    # (tests/engine/test_engine_step_context.py). Counting the whole queue would announce it on every step.
    contexts: list[StepContext] = []
    scenario = small_scenario(
        engine={"max_num_seqs": 2, "max_k": 4},
        workload={"arrivals": {"kind": "poisson", "rate_qps": 100_000, "duration_s": 1e-4}},
    )
    result, steps = run_logged(scenario, recording_policy("fixed:k=0", contexts))
    prompts = int(result.table.prompt_tokens.sum())
    assert len(result.table.prompt_tokens) >= 4
    assert max(ctx.num_waiting for ctx in contexts) >= 2
    assert sum(stats.num_preempted for _, stats in steps) == 0
    assert sum(ctx.num_prefill_tokens for ctx in contexts) == prompts
    full = [ctx for ctx in contexts if ctx.num_running == 2]
    assert full and all(ctx.num_prefill_tokens == 0 for ctx in full)


def test_a_draft_that_rereads_the_scheduled_tokens_pays_for_each_drafted_position() -> None:
    # vLLM's draft-model proposer runs its first pass over every token the target scored (drafts included); the
    # default keeps the draft's own drafts in its KV cache and reads only the new token.
    def steps(first_pass: str, policy: str) -> dict[tuple, float]:
        seen: dict[tuple, float] = {}

        def record_step(record: StepRecord, _stats: StepStats) -> None:
            shape = (record.num_running, record.num_context_tokens, record.num_batched_tokens, record.num_draft_passes)
            seen[shape] = record.duration_s

        scenario = small_scenario(engine={"max_k": 4, "draft_first_pass": first_pass})
        simulate(scenario, policy, 0, on_step=record_step)
        return seen

    assert steps("scheduled", "fixed:k=0") == steps("new_tokens", "fixed:k=0")
    rereading, reading_new = steps("scheduled", "fixed:k=3"), steps("new_tokens", "fixed:k=3")
    # The same step shape with drafts (more than one draft pass): a prefill-only step reads new tokens either way.
    shared = [shape for shape in rereading.keys() & reading_new.keys() if shape[3] > 1]
    assert shared
    assert all(rereading[shape] > reading_new[shape] for shape in shared)


@pytest.mark.parametrize("policy", POLICIES)
def test_drafts_made_a_step_ahead_conserve_tokens_and_kv(policy: str) -> None:
    result, steps = run_logged(small_scenario(engine={"drafts_ahead": True, "num_kv_blocks": 96}), policy)
    assert np.array_equal(result.table.num_output, result.table.output_tokens)
    assert steps[-1][1].num_kv_blocks_used == 0
    for record, stats in steps:
        assert record.num_emitted_tokens == record.num_accepted + stats.num_sampled


def test_drafts_made_a_step_ahead_are_verified_at_the_lower_of_the_two_ks() -> None:
    # vLLM drafts at the end of a step for the next and cuts them to the next step's k: a step verifies at most
    # what the step before it drafted, and runs its own k passes whatever it verifies.
    _, steps = run_logged(small_scenario(engine={"drafts_ahead": True}), "cycle:ks=1-3")
    records = [r for r, _ in steps]
    assert {(r.k, r.num_draft_passes) for r in records} == {(1, 1), (3, 3)}
    assert max(max(r.num_drafted_per_request, default=0) for r in records) == 1
    _, same_step = run_logged(small_scenario(), "cycle:ks=1-3")
    assert max(max(r.num_drafted_per_request, default=0) for r, _ in same_step) == 3
    # At a steady k every decoding request verifies all k drafts, its first decode included.
    _, fixed = run_logged(small_scenario(engine={"drafts_ahead": True}), "fixed:k=3")
    assert {d for r, _ in fixed for d in r.num_drafted_per_request} == {3}


def test_a_rise_in_k_pays_its_passes_a_step_before_its_drafts_count() -> None:
    # cycle 0-2: every k = 2 step follows a k = 0 step, which drafted nothing, so ahead of time nothing is verified.
    scenario = small_scenario(engine={"drafts_ahead": True})
    result, steps = run_logged(scenario, "cycle:ks=0-2")
    assert sum(r.num_drafted for r, _ in steps) == 0
    assert all(r.num_draft_passes == 2 for r, _ in steps if r.k == 2)
    same_step = summarize(simulate(small_scenario(), "cycle:ks=0-2", 0))
    assert summarize(result)["mean_tpot_s"] > same_step["mean_tpot_s"]


def test_a_step_preempts_exactly_when_its_ks_blocks_exceed_the_free_ones() -> None:
    # The context's per-k block count (StepContext.kv_blocks_needed) is what the step then allocates: on steps whose
    # decodes are all there is (no prompt to prefill), a blind fixed k preempts iff its count exceeds the free blocks.
    scenario = tiny_kv_scenario()
    contexts: list[StepContext] = []
    _, steps = run_logged(scenario, recording_policy("fixed:k=3", contexts))
    by_start = {ctx.now_s: ctx for ctx in contexts}
    verdicts = []
    for record, stats in steps:
        ctx = by_start[record.now_s]
        if ctx.kv_blocks_needed and ctx.num_prefill_tokens == 0:
            verdicts.append((ctx.kv_blocks_needed[record.k] > ctx.num_kv_blocks_free, stats.num_preempted > 0))
    assert any(short for short, _ in verdicts) and not all(short for short, _ in verdicts)
    assert all(short == preempted for short, preempted in verdicts)


def test_adaptive_runs_no_k_that_preempts() -> None:
    scenario = tiny_kv_scenario()
    contexts: list[StepContext] = []
    _, steps = run_logged(scenario, recording_policy("adaptive", contexts))
    by_start = {ctx.now_s: ctx for ctx in contexts}
    tight = [(by_start[record.now_s], record.k) for record, _ in steps if by_start[record.now_s].kv_blocks_needed]
    assert tight, "the pool ran short"
    for ctx, k in tight:
        assert ctx.kv_blocks_needed[k] <= max(ctx.num_kv_blocks_free, ctx.kv_blocks_needed[0])
