"""adaptive: the hinge latency fit, the per-bucket correction, marginal prefill pricing and hysteresis."""

from __future__ import annotations

import random

import pytest

from specserve.speculation import EngineTraits, StepContext, StepRecord, make_policy
from specserve.speculation.policies.adaptive import AdaptivePolicy
from specserve.speculation.estimators.bucket_correction import BucketCorrection, bucket_of
from specserve.speculation.estimators.step_latency import HINGED
from specserve.speculation.estimators.step_latency import StepLatencyModel as Unified
from specserve.speculation.latency import StepLatencyModel


def roofline_s(num_batched: int, num_passes: int, num_running: int) -> float:
    """A GPU-like step: memory-bound (20 ms) up to 200 tokens, then 100 us per token; 0.5 ms per draft pass."""
    return 0.002 + max(0.020, 1e-4 * num_batched) + num_passes * (5e-4 + 1e-6 * num_running)


def record(num_batched: int, num_passes: int, num_running: int, k: int = 0, duration_s: float | None = None) -> StepRecord:
    duration = roofline_s(num_batched, num_passes, num_running) if duration_s is None else duration_s
    return StepRecord(now_s=0.0, k=k, duration_s=duration, num_running=num_running, num_context_tokens=0,
                      num_batched_tokens=num_batched, num_draft_passes=num_passes, num_emitted_tokens=num_running)


def kinked_steps(n: int = 3000, seed: int = 0) -> list[StepRecord]:
    rng = random.Random(seed)
    steps = []
    for _ in range(n):
        batch, k = rng.randint(1, 256), rng.randint(0, 4)
        prefill = rng.choice([0, 0, 0, rng.randint(1, 4096)])
        steps.append(record(prefill + batch * (k + 1), max(k, 1), batch, k))
    return steps


def test_hinge_fit_follows_a_kinked_step_cost_where_a_line_cannot() -> None:
    hinge, line = Unified(HINGED, half_life_steps=1e6, refit_every=8), StepLatencyModel(half_life_steps=1e6)
    for step in kinked_steps():
        hinge.observe(step)
        line.observe(step)
    for batched in (40, 120, 600, 3000):
        truth = roofline_s(batched, 1, 16)
        assert hinge.predict(0, batched, 1, 16) == pytest.approx(truth, rel=0.08)
    # The straight line misprices the flat region's marginal token badly: what k costs at small batches.
    flat_slope_hinge = hinge.predict(0, 150, 1, 16) - hinge.predict(0, 50, 1, 16)
    flat_slope_line = line.predict(0, 150, 1, 16) - line.predict(0, 50, 1, 16)
    assert abs(flat_slope_hinge) < 0.5 * abs(flat_slope_line)


def test_hinge_predictions_never_fall_with_more_tokens() -> None:
    model = Unified(HINGED, refit_every=8)
    rng = random.Random(1)
    for _ in range(500):  # noisy data that, unclipped, would fit negative slopes somewhere
        model.observe(record(rng.randint(1, 3000), 1, 8, duration_s=rng.uniform(0.01, 0.03)))
    predictions = [model.predict(0, n, 1, 8) for n in range(0, 5000, 50)]
    assert all(b >= a - 1e-12 for a, b in zip(predictions, predictions[1:]))


def test_buckets_are_powers_of_two() -> None:
    assert [bucket_of(b) for b in (0, 1, 2, 3, 4, 5, 8, 9, 64, 65)] == [0, 0, 1, 2, 2, 3, 3, 4, 6, 7]


def test_bucket_correction_averages_residuals_and_falls_back_within_the_bucket() -> None:
    correction = BucketCorrection(memory=4.0)
    for _ in range(50):
        correction.observe(30, 3, 0.002)
    correction.observe(30, 4, -0.001)
    assert correction.correction_s(32, 3) == pytest.approx(0.002)
    assert correction.correction_s(17, 4) == pytest.approx(-0.001)
    assert correction.correction_s(20, 2) == pytest.approx(0.002)  # unexplored k: the bucket's main cell
    assert correction.correction_s(100, 3) == 0.0  # another bucket knows nothing yet
    with pytest.raises(ValueError, match="memory"):
        BucketCorrection(memory=0.5)


def trained_policy(spec: str = "adaptive", alpha: float = 0.8, max_k: int = 4,
                   asks_stop_drafting: bool = False) -> AdaptivePolicy:
    """A policy that has seen the kinked step cost and a steady acceptance of ``alpha``."""
    policy = make_policy(spec, EngineTraits(max_k=max_k, asks_stop_drafting=asks_stop_drafting))
    assert isinstance(policy, AdaptivePolicy)
    rng = random.Random(2)
    for step in kinked_steps(2000):
        policy.latency.observe(step)
    for _ in range(200):
        k, batch = rng.randint(1, max_k), 8
        accepted = []
        for _ in range(batch):
            n = 0
            while n < k and rng.random() < alpha:
                n += 1
            accepted.append(n)
        policy.acceptance.observe(StepRecord(
            now_s=0.0, k=k, duration_s=0.02, num_running=batch, num_context_tokens=0, num_batched_tokens=batch * (k + 1),
            num_draft_passes=k, num_emitted_tokens=batch + sum(accepted), num_drafted_per_request=(k,) * batch,
            num_accepted_per_request=tuple(accepted)))
    return policy


def ctx(batch: int, prefill: int = 0, now_s: float = 0.0, resident: bool = True) -> StepContext:
    return StepContext(now_s=now_s, num_running=batch, num_waiting=0, num_context_tokens=0,
                       num_prefill_tokens=prefill, draft_resident=resident)


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


def test_hysteresis_keeps_k_unless_the_gain_clears_the_margin() -> None:
    sticky = trained_policy("adaptive:switch_margin=0.5,explore_interval_s=inf")
    sticky._k = 2
    assert sticky.choose(ctx(4)).k == 2
    free = trained_policy("adaptive:switch_margin=0.0,explore_interval_s=inf")
    free._k = 2
    assert free.choose(ctx(4)).k == 4


def test_no_draft_no_speculation_and_k_capped_by_the_engine() -> None:
    policy = trained_policy(max_k=2)
    assert policy.choose(ctx(4, resident=False)).k == 0
    assert policy.choose(ctx(4)).k <= 2
    assert policy.limit_k == 2


def test_confidences_stop_the_draft_loop_only_where_the_engine_asks() -> None:
    spec = "adaptive:explore_interval_s=inf,early_stop_extra=2"
    plain = trained_policy(spec, max_k=8)
    chosen = plain.choose(ctx(32)).k
    assert 0 < chosen <= 6 and not plain.stop_drafting(0, 0.01)
    asked = trained_policy(spec, max_k=8, asks_stop_drafting=True)
    budget = asked.choose(ctx(32)).k
    assert budget == chosen + 2  # sure drafts may run past k
    assert asked.stop_drafting(0, 0.01)  # an unsure first draft: nothing further is likely to survive
    assert asked.choose(ctx(32)).k == budget
    assert [asked.stop_drafting(pos, 0.99) for pos in range(budget)] == [False] * (budget - 1) + [True]
    assert asked.describe()["num_early_stops"] == 1.0
    off = trained_policy(spec + ",confidence_stop=false", max_k=8, asks_stop_drafting=True)
    assert off.choose(ctx(32)).k == chosen and not off.stop_drafting(0, 0.01)


def test_predict_many_agrees_with_predict_and_refits_every_few_steps() -> None:
    model = Unified(HINGED, refit_every=4)
    steps = kinked_steps(200)
    for step in steps:
        model.observe(step)
    ks = [0, 1, 2, 3, 4]
    many = model.predict_many(700, [300 + 40 * (k + 1) for k in ks], [max(k, 1) for k in ks], 40)
    assert many.tolist() == pytest.approx([model.predict(700, 300 + 40 * (k + 1), max(k, 1), 40) for k in ks])
    assert model.batched_token_seconds(3000) == pytest.approx(model.predict(0, 3000, 0, 0) - model.predict(0, 0, 0, 0))
    before = model.coefficients()
    model.observe(steps[0])
    assert model.coefficients() == before  # one step more: the last solve still stands
    for step in steps[1:4]:
        model.observe(step)
    assert model.coefficients() != before
    with pytest.raises(ValueError, match="refit_every=0"):
        Unified(HINGED, refit_every=0)


def test_an_exploration_down_to_zero_is_not_extended() -> None:
    policy = trained_policy("adaptive:explore_interval_s=0.5,switch_margin=0.0,min_gain=0.0", alpha=0.3,
                            max_k=4, asks_stop_drafting=True)
    ks = [policy.choose(ctx(64, now_s=0.1 * step)).k for step in range(40)]
    assert policy._k == 1 and 0 in ks, ks  # k = 1 settled, and one step explored k = 0 as it is


def test_steps_folded_in_at_refit_give_the_fit_of_steps_added_one_by_one() -> None:
    every, batched = Unified(HINGED, refit_every=1), Unified(HINGED, refit_every=8)
    for step in kinked_steps(203):
        assert every.observe(step) > 0 and batched.observe(step) > 0
    assert batched._solve() == pytest.approx(every._solve(), rel=1e-9, abs=1e-15)
