"""adaptive: the hinged latency fit, the per-bucket correction, marginal prefill pricing, hysteresis and early stop."""

from __future__ import annotations

import dataclasses
import math
import random
from itertools import pairwise

import pytest
from speculation_synthetic import draw_accepted, kinked_steps, make_record, roofline_s

from specserve.speculation import EngineTraits, StepContext, StepRecord, make_policy
from specserve.speculation.estimators.bucket_correction import BucketCorrection, bucket_of
from specserve.speculation.policies.adaptive import AdaptivePolicy


def test_buckets_are_powers_of_two() -> None:
    assert [bucket_of(b) for b in (0, 1, 2, 3, 4, 5, 8, 9, 64, 65)] == [0, 0, 1, 2, 2, 3, 3, 4, 6, 7]


def predicted(correction: BucketCorrection, num_running: int, k: int, model_s: float) -> float:
    return correction.factor(num_running, k) * model_s


def test_bucket_correction_learns_the_miss_and_falls_back_within_the_bucket() -> None:
    correction = BucketCorrection(memory=4.0, prior_samples=0.0)
    for _ in range(50):
        correction.observe(30, 3, 0.012, 0.010)
    correction.observe(30, 4, 0.009, 0.010)
    assert predicted(correction, 32, 3, 0.010) == pytest.approx(0.012)
    assert predicted(correction, 17, 4, 0.010) < predicted(correction, 17, 3, 0.010)  # one quicker step at k = 4
    assert predicted(correction, 20, 2, 0.010) == pytest.approx(0.012)  # unexplored k: the bucket's main cell
    assert predicted(correction, 100, 3, 0.010) == 0.010  # another bucket knows nothing yet
    for bad in ({"memory": 0.5}, {"prior_samples": -1.0}, {"max_relative": 0.0}, {"level_memory": 0.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            BucketCorrection(**bad)


def test_a_thinly_measured_cell_earns_its_correction_as_its_samples_add_up() -> None:
    correction = BucketCorrection(memory=20.0, prior_samples=3.0)
    for _ in range(50):
        correction.observe(8, 1, 0.012, 0.010)
    correction.observe(8, 2, 0.008, 0.010)
    once = predicted(correction, 8, 2, 0.010)
    assert 0.012 > once > 0.008  # between the bucket's offset and the one sample
    for _ in range(40):
        correction.observe(8, 1, 0.012, 0.010)  # k = 2 measured beside k = 1, as explorations measure it
        correction.observe(8, 2, 0.008, 0.010)
    assert predicted(correction, 8, 2, 0.010) < once
    # Most of the 4 ms measured between them: shrunk by three pseudo-samples against the cell's twenty, and
    # measured against a level that the k = 2 steps move too.
    difference = predicted(correction, 8, 1, 0.010) - predicted(correction, 8, 2, 0.010)
    assert 0.0025 < difference < 0.004


def test_a_stalled_step_moves_a_correction_by_at_most_its_prediction() -> None:
    correction = BucketCorrection(prior_samples=0.0, level_memory=math.inf)
    correction.observe(1, 0, 0.430, 0.040)  # a 430 ms step where 40 ms was predicted
    assert predicted(correction, 1, 0, 0.040) == pytest.approx(0.080)
    correction.observe(2, 0, -0.060, 0.040)  # below zero seconds: a clock glitch, bounded alike
    assert predicted(correction, 2, 0, 0.040) == pytest.approx(0.004)  # a tenth: never a free step
    correction.observe(2, 0, 0.040, 0.0)  # a prediction of nothing has nothing to correct: ignored
    assert correction.num_samples(2, 0) == pytest.approx(1.0)


def test_a_slow_phase_during_one_ks_run_moves_the_level_not_that_k_against_the_others() -> None:
    """k = 1 and k = 2 cost what the model says (measured side by side); then k = 2 runs for a while in a phase
    20 % slower, and k = 1 runs at full speed. Without a level (each cell averages the whole residual), k = 2
    stays priced about 20 ms above k = 1; with one, most of the phase went to the level and left with it."""
    with_level, without = BucketCorrection(), BucketCorrection(level_memory=math.inf)
    for correction in (with_level, without):
        for _ in range(50):
            correction.observe(16, 1, 0.100, 0.100)
            correction.observe(16, 2, 0.100, 0.100)
        for _ in range(100):
            correction.observe(16, 2, 0.120, 0.100)
        for _ in range(100):
            correction.observe(16, 1, 0.100, 0.100)
    gap_without = predicted(without, 16, 2, 0.100) - predicted(without, 16, 1, 0.100)
    gap_with = predicted(with_level, 16, 2, 0.100) - predicted(with_level, 16, 1, 0.100)
    assert gap_without > 0.015
    assert abs(gap_with) < 0.25 * gap_without
    assert predicted(with_level, 16, 1, 0.100) == pytest.approx(0.100, rel=0.01)


def test_a_phase_while_one_k_runs_scales_every_k_alike() -> None:
    correction = BucketCorrection()
    for _ in range(60):  # k = 2 costs 10 ms over the model, beside k = 1
        correction.observe(8, 1, 0.100, 0.100)
        correction.observe(8, 2, 0.110, 0.100)
    before = predicted(correction, 8, 2, 0.100) / predicted(correction, 8, 1, 0.100)
    for _ in range(30):  # a phase 30 % slower, while k = 1 alone runs
        correction.observe(8, 1, 0.130, 0.100)
    assert predicted(correction, 8, 1, 0.100) == pytest.approx(0.130, rel=0.02)
    after = predicted(correction, 8, 2, 0.100) / predicted(correction, 8, 1, 0.100)
    stale = BucketCorrection(level_memory=math.inf)  # the same steps, each cell averaging the whole residual
    for _ in range(60):
        stale.observe(8, 1, 0.100, 0.100)
        stale.observe(8, 2, 0.110, 0.100)
    for _ in range(30):
        stale.observe(8, 1, 0.130, 0.100)
    stale_after = predicted(stale, 8, 2, 0.100) / predicted(stale, 8, 1, 0.100)
    assert abs(after - before) < 0.25 * abs(stale_after - before)


def test_a_cold_fits_first_miss_does_not_price_a_k_that_never_runs_again() -> None:
    """A served engine's first step is a prefill at k = 0 that the cold fit prices at a few ms; then one request
    decodes at k = 2 and k = 0 never runs again at that batch. That first miss is the prior's: were it learned as
    k = 0's offset at batch 1 (1.3 against 0.9 for k = 2), nothing would bring it down."""
    truth = (34e-3, 0.0, 30e-3, 8e-3, 2e-3)  # at one request: 64 ms at k = 0, 144 ms at k = 2
    policy = make_policy("adaptive", EngineTraits(max_k=4, k0_runs_draft_pass=False))
    assert isinstance(policy, AdaptivePolicy)
    rng = random.Random(0)
    prefill = make_record(
        rng, truth, now_s=0.0, k=0, num_running=1, alpha=0.6, num_context_tokens=0, num_prefill_tokens=32
    )
    policy.observe(dataclasses.replace(prefill, duration_s=1.33))
    for step in range(100):
        record = make_record(
            rng, truth, now_s=1.33 + 0.144 * step, k=2, num_running=1, alpha=0.6, num_context_tokens=33 + 3 * step
        )
        policy.observe(record)
    k0, _, k2 = policy.correction.factors(1, 3)
    assert k0 == pytest.approx(k2, rel=0.1)


def trained_policy(
    spec: str = "adaptive",
    alpha: float = 0.8,
    max_k: int = 4,
    asks_stop_drafting: bool = False,
    resume_s_per_token: float | None = None,
    verifies_confident_prefix: bool = False,
    drafts_ahead: bool = False,
) -> AdaptivePolicy:
    """A policy whose step-time fit has learned the kinked step cost (its correction has not: the steps go to the
    fit directly), then has observed steps with a steady acceptance of ``alpha``."""
    traits = EngineTraits(
        max_k=max_k,
        asks_stop_drafting=asks_stop_drafting,
        verifies_confident_prefix=verifies_confident_prefix,
        k0_runs_draft_pass=resume_s_per_token is None,
        resume_s_per_token=resume_s_per_token,
        drafts_ahead=drafts_ahead,
    )
    policy = make_policy(spec, traits)
    assert isinstance(policy, AdaptivePolicy)
    rng = random.Random(2)
    for step in kinked_steps(2000):
        policy.latency.observe(step)
    for _ in range(200):
        k, batch = rng.randint(1, max_k), 8
        accepted = tuple(draw_accepted(rng, alpha, k) for _ in range(batch))
        policy.observe(
            StepRecord(
                now_s=0.0,
                k=k,
                duration_s=roofline_s(batch * (k + 1), k, batch),
                num_running=batch,
                num_context_tokens=0,
                num_batched_tokens=batch * (k + 1),
                num_draft_passes=k,
                num_emitted_tokens=batch + sum(accepted),
                num_drafted_per_request=(k,) * batch,
                num_accepted_per_request=accepted,
            )
        )
    return policy


def ctx(batch: int, prefill: int = 0, now_s: float = 0.0, resident: bool = True) -> StepContext:
    return StepContext(
        now_s=now_s,
        num_running=batch,
        num_waiting=0,
        num_context_tokens=0,
        num_prefill_tokens=prefill,
        draft_resident=resident,
    )


def test_small_batches_speculate_deep_and_big_batches_not_at_all() -> None:
    policy = trained_policy()
    assert policy.choose(ctx(4)).k == 4
    big = trained_policy()
    assert big.choose(ctx(1024)).k == 0


def test_a_prefill_chunk_past_the_ridge_point_makes_drafts_cost_their_flops() -> None:
    policy = trained_policy()
    # Alone the decodes of 8 requests sit in the flat region; riding on a 4000-token chunk every draft
    # token costs compute, and the marginal price says so where ignoring the chunk would not.
    flat = policy.decode_seconds(ctx(8), 4) - policy.decode_seconds(ctx(8), 0)
    loaded = policy.decode_seconds(ctx(8, prefill=4000), 4) - policy.decode_seconds(ctx(8, prefill=4000), 0)
    assert loaded > flat + 0.002  # the 32 draft tokens' FLOPs: 3.2 ms
    assert loaded == pytest.approx(8 * 4 * 1e-4 + 4 * 5e-4, rel=0.3)


def test_where_k0_skips_the_draft_a_step_with_prompt_tokens_still_pays_its_pass_at_k0() -> None:
    # The engine skips the draft's pass at k = 0 only on pure decode steps: a prompt chunk always reaches the
    # draft. So on a prefill step k = 0 costs what it costs where k = 0 never skips, and on a decode step a pass less.
    skips = trained_policy(resume_s_per_token=1e-6)
    runs = trained_policy()
    assert skips.decode_seconds(ctx(64, prefill=300), 0) == pytest.approx(runs.decode_seconds(ctx(64, prefill=300), 0))
    assert skips.decode_seconds(ctx(64), 0) < runs.decode_seconds(ctx(64), 0)
    for k in range(1, 5):  # a k > 0 runs its passes either way
        assert skips.decode_seconds(ctx(64, prefill=300), k) == pytest.approx(
            runs.decode_seconds(ctx(64, prefill=300), k)
        )


def test_where_drafts_are_made_ahead_a_prompt_riding_on_one_step_does_not_stop_speculation() -> None:
    # At 150 requests and acceptance 0.5 k = 1; priced at the margin, a 110-token chunk on one step favours k = 0
    # (no switch margin, so that the prices alone decide).
    spec = "adaptive:explore_interval_s=inf,switch_margin=0"
    free = trained_policy(spec, alpha=0.5)
    assert [free.choose(ctx(150, prefill=p)).k for p in (0, 110, 0)] == [1, 0, 1]
    held = trained_policy(spec, alpha=0.5, drafts_ahead=True)
    assert [held.choose(ctx(150, prefill=p)).k for p in (0, 110, 0)] == [1, 1, 1]
    # Where the decodes alone would stop too (300 requests), the prefill step's stop stands.
    assert held.choose(ctx(300, prefill=110)).k == 0


def test_where_drafts_are_made_ahead_a_start_only_a_prompt_asks_for_is_held() -> None:
    # At 128 requests and acceptance 0.5 the decodes alone stay at k = 0 (the draft's pass skipped); on a step
    # carrying a prompt, which runs the pass at k = 0 too, k = 1 pays. Drafts made ahead count only if the next
    # step speculates as well, which it would not: there the start is held.
    spec = "adaptive:explore_interval_s=inf,probe_interval_s=inf,switch_margin=0"
    free = trained_policy(spec, alpha=0.5, resume_s_per_token=1e-9)
    assert [free.choose(ctx(128, prefill=p)).k for p in (0, 300, 0)] == [0, 1, 0]
    held = trained_policy(spec, alpha=0.5, resume_s_per_token=1e-9, drafts_ahead=True)
    assert [held.choose(ctx(128, prefill=p)).k for p in (0, 300, 0)] == [0, 0, 0]


def test_where_drafts_are_made_ahead_a_prompt_may_still_move_k_between_two_depths() -> None:
    # At 96 requests k = 2; a 4000-token chunk on one step favours k = 3. No drafts are thrown away by the move,
    # so it is not held.
    spec = "adaptive:explore_interval_s=inf,switch_margin=0"
    held = trained_policy(spec, drafts_ahead=True)
    assert [held.choose(ctx(96, prefill=p)).k for p in (0, 4000, 0)] == [2, 3, 2]


def test_hysteresis_keeps_k_unless_the_gain_clears_the_margin() -> None:
    # At batch 96 the policy settles on k = 2; at batch 4, k = 4 is best but by less than 50%.
    sticky = trained_policy("adaptive:switch_margin=0.5,explore_interval_s=inf")
    assert sticky.choose(ctx(96)).k == 2
    assert sticky.choose(ctx(4)).k == 2
    free = trained_policy("adaptive:switch_margin=0.0,explore_interval_s=inf")
    assert free.choose(ctx(96)).k == 2
    assert free.choose(ctx(4)).k == 4


def test_stopping_speculation_clears_the_margin_too() -> None:
    # Settled on k = 2 at batch 96; at batch 512 k = 0 is predicted best, k = 1 next.
    probe = trained_policy("adaptive:explore_interval_s=inf")
    assert probe.choose(ctx(96)).k == 2
    goodputs = probe.core.goodputs(512, probe.decode_seconds_all(ctx(512)).tolist())
    assert goodputs[0] == max(goodputs)
    gain = goodputs[0] / goodputs[2] - 1.0
    sticky = trained_policy(f"adaptive:switch_margin={1.2 * gain},explore_interval_s=inf")
    assert sticky.choose(ctx(96)).k == 2
    assert sticky.choose(ctx(512)).k == 2
    moving = trained_policy(f"adaptive:switch_margin={0.8 * gain},explore_interval_s=inf")
    assert moving.choose(ctx(96)).k == 2
    assert moving.choose(ctx(512)).k == 0


def test_no_draft_no_speculation_and_k_capped_by_the_engine() -> None:
    policy = trained_policy(max_k=2)
    assert policy.choose(ctx(4, resident=False)).k == 0
    assert policy.choose(ctx(4)).k <= 2
    assert policy.max_k == 2


def test_confidences_stop_the_draft_loop_only_where_the_engine_asks() -> None:
    spec = "adaptive:explore_interval_s=inf,early_stop_extra=2"
    plain = trained_policy(spec, max_k=8).choose(ctx(32))
    assert 0 < plain.k <= 6 and plain.draft_stop is None
    asked = trained_policy(spec, max_k=8, asks_stop_drafting=True)
    decision = asked.choose(ctx(32))
    assert decision.k == plain.k + 2  # sure drafts may run past k
    assert decision.draft_stop.after_pass(0, 0.01)  # an unsure first draft: nothing further is likely to survive
    decision = asked.choose(ctx(32))
    assert decision.k == plain.k + 2
    sure = [decision.draft_stop.after_pass(pos, 0.99) for pos in range(decision.k)]
    assert sure == [False] * (decision.k - 1) + [True]  # the budget, not an early stop
    assert asked.describe()["num_early_stops"] == 1.0
    # Where drafts are verified a step after they were made (vLLM) there is no loop to stop: every draft made is
    # verified, as k was priced.
    later = trained_policy(spec, max_k=8, verifies_confident_prefix=True).choose(ctx(32))
    assert later.k == plain.k and later.draft_stop is None


def test_an_exploration_down_to_zero_is_not_extended() -> None:
    policy = trained_policy(
        "adaptive:explore_interval_s=0.5,switch_margin=0.0,min_gain=0.0", alpha=0.3, max_k=4, asks_stop_drafting=True
    )
    decisions = [policy.choose(ctx(64, now_s=0.1 * step)) for step in range(40)]
    # k = 1 settled, granted 1 + 2 drafts; explorations ran k = 2 (granted 4) and k = 0, which runs as it is.
    assert {d.k for d in decisions} == {0, 3, 4}
    assert [d.k for d in decisions].count(3) > 30
    assert all((d.draft_stop is None) == (d.k == 0) for d in decisions)


def k0_steps(policy: AdaptivePolicy, steps: int, batch: int, draft_passes: int) -> None:
    for _ in range(steps):
        policy.observe(
            StepRecord(
                now_s=0.0,
                k=0,
                duration_s=roofline_s(batch, draft_passes, batch),
                num_running=batch,
                num_context_tokens=0,
                num_batched_tokens=batch,
                num_draft_passes=draft_passes,
                num_emitted_tokens=batch,
            )
        )


@pytest.mark.parametrize(
    ("resume_s_per_token", "draft_passes", "context_per_request", "resumes"),
    [
        (1e-2, 0, 400, False),  # 299 tokens x 4 requests to catch up at 10 ms each: 12 s, more than a second's gain
        (1e-7, 0, 400, True),  # the same catch-up, nearly free
        (1e-2, 1, 400, True),  # k = 0 kept the draft in sync: nothing to catch up
        (1e-2, 0, 2, True),  # the requests are 2 tokens long: whatever the count says, they lag by at most that
    ],
)
def test_resuming_waits_until_the_gain_repays_the_catch_up(
    resume_s_per_token: float, draft_passes: int, context_per_request: int, resumes: bool
) -> None:
    spec = "adaptive:explore_interval_s=inf,probe_interval_s=inf"
    policy = trained_policy(spec, resume_s_per_token=resume_s_per_token)
    assert policy.choose(ctx(1024)).k == 0  # settled at k = 0 ...
    k0_steps(policy, 300, batch=4, draft_passes=draft_passes)  # ... for 300 steps
    small = StepContext(now_s=1.0, num_running=4, num_waiting=0, num_context_tokens=4 * context_per_request)
    assert (policy.choose(small).k == 4) == resumes
    assert policy.describe()["num_resumes_deferred"] == (0.0 if resumes else 1.0)


def probe_starts(policy: AdaptivePolicy, batch: int, start_s: float, seconds: float) -> list[float]:
    """The times at which a probe began over ``seconds`` of 0.1 s steps (no verdicts come back)."""
    starts, previous = [], 0
    for step in range(round(seconds / 0.1)):
        now_s = start_s + 0.1 * step
        k = policy.choose(ctx(batch, now_s=now_s)).k
        if k > 0 and previous == 0:
            starts.append(round(now_s, 1))
        previous = k
    return starts


def test_at_k0_a_probe_runs_every_interval() -> None:
    policy = trained_policy("adaptive:explore_interval_s=inf,probe_interval_s=2")
    starts = probe_starts(policy, batch=1024, start_s=0.0, seconds=11.0)
    assert [round(b - a, 1) for a, b in pairwise([0.0, *starts])] == [2.0] * 5
    # Speculating on its own choice resets the clock: the first probe after the next stop comes after the base.
    assert policy.choose(ctx(4, now_s=100.0)).k > 0
    assert probe_starts(policy, batch=1024, start_s=100.1, seconds=3.0) == [102.1]


def test_at_k0_a_batch_of_requests_the_estimate_never_saw_is_probed_at_once() -> None:
    # Acceptance belongs to the requests' text: an estimate that put k at 0 was learned from requests that may be
    # gone, so the policy probes as soon as none of them runs, not only on the clock.
    policy = trained_policy("adaptive:explore_interval_s=inf,probe_interval_s=2")

    def k_at(now_s: float, batch: int, prefix: str, kept: int = 0) -> int:
        ids = tuple(f"a{i}" for i in range(kept)) + tuple(f"{prefix}{i}" for i in range(kept, batch))
        return policy.choose(dataclasses.replace(ctx(batch, now_s=now_s), request_ids=ids)).k

    assert k_at(0.0, 4, "a") > 0, "speculating: its verdicts are about a0-a3"
    assert k_at(0.1, 1024, "a") == 0, "a0-a3 still run"
    assert k_at(0.2, 1024, "b", kept=1) == 0, "a0 still runs"
    assert k_at(0.3, 1024, "b") > 0
    assert policy.describe()["num_turnover_probes"] == 1.0
    # The estimate that held k at 0 keeps its rate but weighs no more than the prior: the probe's verdicts decide.
    assert policy.core.acceptance.num_reached()[0] <= policy.core.acceptance.prior_weight


def test_a_nearly_full_kv_pool_cuts_the_k_that_runs_and_the_policy_returns_once_it_has_room() -> None:
    policy = trained_policy()
    assert policy.choose(ctx(4)).k == 4
    tight = dataclasses.replace(ctx(4), num_kv_blocks_free=2, kv_blocks_needed=(0, 1, 2, 4, 4))
    assert policy.choose(tight).k == 2
    assert policy.describe()["num_kv_cuts"] == 1
    assert policy.choose(ctx(4)).k == 4, "the cut is the pool's, not the policy's choice"


def test_exploring_down_to_zero_measures_what_a_step_without_drafts_costs() -> None:
    """An engine whose draft passes dominate the step (11 ms each, 5.2 ms for a step without one, as the tiny
    pair on a 2-core CPU): k = 0 serves the most at any acceptance below about 0.9. Settled at k >= 2, the policy
    explores only k +- 1, so the fit prices k = 0 by extrapolation from the cold start's steps and those
    explorations; the data-scaled fit gets there on every seed and prices a step without drafts as it costs."""
    truth = (4e-3, 0.0, 0.3e-3, 11e-3, 0.1e-3)
    traits = EngineTraits(max_k=4, k0_runs_draft_pass=False, drafts_ahead=False)

    def run(seed: int) -> tuple[float, float]:
        """The mean k over the second half of 40 s at four requests, and the k = 0 step cost priced at its end."""
        policy, rng, now_s, chosen = make_policy("adaptive", traits), random.Random(seed), 0.0, []
        while now_s < 40.0:
            ctx = StepContext(now_s=now_s, num_running=4, num_waiting=0, num_context_tokens=400)
            k = policy.choose(ctx).k
            record = make_record(
                rng,
                truth,
                now_s=now_s,
                k=k,
                num_running=4,
                alpha=0.75,
                num_context_tokens=400,
                k0_runs_draft_pass=False,
            )
            policy.observe(record)
            chosen.append(k)
            now_s += record.duration_s
        late = chosen[len(chosen) // 2 :]
        ctx = StepContext(now_s=now_s, num_running=4, num_waiting=0, num_context_tokens=400)
        return sum(late) / len(late), float(policy.decode_seconds_all(ctx)[0])

    k0_s = 4e-3 + 4 * 0.3e-3
    for seed in range(6):
        mean_k, priced = run(seed)
        assert mean_k < 0.2 and priced == pytest.approx(k0_s, rel=0.1), (seed, mean_k, priced)


def expanded_steps(k: int, num_steps: int) -> list[StepRecord]:
    """Decode steps at one k on a batch-expansion engine, parts timed: the target's pass reads each request's context
    once per scored position (5 ms + 0.5 us per token read + 20 us per batched token), the draft's passes cost 1 ms
    each, the rest 1 ms."""
    rng = random.Random(4)
    out = []
    for step in range(num_steps):
        batch = rng.randint(2, 16)
        context = sum(rng.randint(200, 4000) for _ in range(batch))
        reads = (k + 1) * context + batch * k * (k + 1) / 2
        forward_s = 5e-3 + 0.5e-6 * reads + 20e-6 * batch * (k + 1)
        draft_s = k * 1e-3
        out.append(
            StepRecord(
                now_s=step * 0.05,
                k=k,
                duration_s=forward_s + draft_s + 1e-3,
                num_running=batch,
                num_context_tokens=context,
                num_batched_tokens=batch * (k + 1),
                num_draft_passes=k,
                num_emitted_tokens=2 * batch,
                num_drafted_per_request=(k,) * batch,
                num_accepted_per_request=(1,) * batch,
                forward_s=forward_s,
                draft_s=draft_s,
            )
        )
    return out


def test_on_a_batch_expansion_engine_each_further_k_pays_another_read_of_the_context() -> None:
    # Learned at k = 2 alone: a further k reads the 8 requests' 16,000 context tokens once more (8 ms), plus its
    # pass and its tokens. Fitted on the plain context, the target's part would price that read as k = 2's share.
    truth_s = 0.5e-6 * (16_000 + 8 * 3) + 20e-6 * 8 + 1e-3
    priced = {}
    for expansion in (True, False):
        policy = make_policy("adaptive", EngineTraits(max_k=4, batch_expansion=expansion))
        assert isinstance(policy, AdaptivePolicy)
        for record in expanded_steps(2, 1500):
            policy.observe(record)
        step = StepContext(now_s=0.0, num_running=8, num_waiting=0, num_context_tokens=16_000)
        seconds = policy.decode_seconds_all(step)
        priced[expansion] = seconds[3] - seconds[2]
    assert priced[True] == pytest.approx(truth_s, rel=0.1)
    assert priced[False] < 0.7 * truth_s


def test_turnover_probes_back_off_while_k_stays_0_and_come_at_once_again_after_speculating() -> None:
    # Random prompts: every new batch is as unpredictable as the last, and each probe pays the draft's catch-up.
    policy = trained_policy("adaptive:explore_interval_s=inf,probe_interval_s=1000,probe_turnover_backoff_max=8")

    def turnover_gaps(start_s: float, steps: int) -> list[int]:
        """Steps at k = 0 before each probe, each step a batch of requests never seen before (a turnover) and no
        verdicts coming back: the probe's own step is the turnover that brings it."""
        gaps, turnovers, previous = [], 0, 0
        for step in range(steps):
            ids = tuple(f"s{start_s}-{step}-{i}" for i in range(1024))
            k = policy.choose(dataclasses.replace(ctx(1024, now_s=start_s + 0.01 * step), request_ids=ids)).k
            if k > 0 and previous == 0:
                gaps.append(turnovers)
                turnovers = 0
            elif k == 0:
                turnovers += 1
            previous = k
        return gaps

    assert turnover_gaps(0.0, 60)[:5] == [0, 1, 3, 7, 7], "1, 2, 4, then 8 turnovers a probe"
    # The policy speculates on its own: the next stop probes at the first turnover again.
    assert policy.choose(ctx(4, now_s=10.0)).k > 0
    assert turnover_gaps(10.01, 6)[:1] == [0]
