"""StepLatencyModel: TurboSpec's Eq. 3 extended with the draft's passes, fitted online; with knots, a spline."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from itertools import pairwise

import numpy as np
import pytest
from speculation_synthetic import kinked_steps, make_record, roofline_record, roofline_s, varied_records

from specserve.speculation import StepRecord
from specserve.speculation.estimators.step_latency import HINGED, LINEAR, StepFeatures, StepLatencyModel

# Deliberately far from the default prior (5 ms, 1 us, 20 us, 1 ms, 10 us) in every coefficient.
TRUE = (8e-3, 0.3e-6, 45e-6, 2.5e-3, 4e-6)


def test_predicts_the_prior_before_data() -> None:
    model = StepLatencyModel()
    assert list(model.coefficients()) == [
        "intercept_s",
        "s_per_context_token",
        "s_per_batched_token",
        "s_per_draft_pass",
        "s_per_draft_pass_request",
    ]
    # 5 ms + 1000 * 1 us + 40 * 20 us + 2 * 1 ms + 2 * 8 * 10 us
    assert model.predict(1000, 40, 2, 8) == pytest.approx(8.96e-3)
    hinged = StepLatencyModel(HINGED)
    # HINGED's rest of the step: its fixed part comes out of the intercept's 5 ms, its 20 us per request adds.
    assert hinged.predict(1000, 4000, 2, 300) == pytest.approx(
        5e-3 + 1e-3 + 4000 * 20e-6 + 2 * (1e-3 + 300 * 10e-6) + 300 * 20e-6
    )


def explicit_least_squares(records: list[StepRecord], half_life_steps: float, prior_weight: float) -> list[float]:
    """The ridge fit written as one weighted least-squares problem: step t weighs 0.5^((n - 1 - t) / half_life),
    and the prior adds prior_weight * ||phi / scales - prior / scales||^2 in the model's scaled units."""
    scales = np.array(LINEAR.scales())
    prior = np.array(LINEAR.default_prior())
    n = len(records)
    rows = [
        np.array(LINEAR.row(r.num_context_tokens, r.num_batched_tokens, r.num_draft_passes, r.num_running)) / scales
        for r in records
    ]
    weights = np.sqrt([0.5 ** ((n - 1 - t) / half_life_steps) for t in range(n)])
    a = np.vstack([np.array(rows) * weights[:, None], np.sqrt(prior_weight) * np.eye(len(scales))])
    b = np.concatenate([np.array([r.duration_s for r in records]) * weights, np.sqrt(prior_weight) * prior * scales])
    solution, *_ = np.linalg.lstsq(a, b, rcond=None)
    return (solution / scales).tolist()


def test_without_knots_the_fit_is_the_explicit_weighted_least_squares_solution() -> None:
    rng = random.Random(1)
    noisy = [
        replace(r, duration_s=r.duration_s * rng.uniform(0.9, 1.1))
        for r in varied_records(seed=5, coefficients=TRUE, alpha=0.6, max_k=6, num_steps=400)
    ]
    model = StepLatencyModel(half_life_steps=50.0, prior_weight=3.0)
    for record in noisy:
        model.observe(record)
    expected = explicit_least_squares(noisy, half_life_steps=50.0, prior_weight=3.0)
    assert min(expected) > 0  # nothing clipped: the comparison is of the solve itself
    assert list(model.coefficients().values()) == pytest.approx(expected, rel=1e-9)


def test_recovers_known_coefficients_from_noiseless_records() -> None:
    model = StepLatencyModel(prior_weight=1e-9)
    for record in varied_records(seed=1, coefficients=TRUE, alpha=0.7, max_k=6, num_steps=300):
        model.observe(record)
    assert list(model.coefficients().values()) == pytest.approx(TRUE, rel=1e-6)
    assert model.predict(20_000, 96, 3, 32) == pytest.approx(
        TRUE[0] + TRUE[1] * 20_000 + TRUE[2] * 96 + TRUE[3] * 3 + TRUE[4] * 3 * 32
    )


def test_default_ridge_biases_the_fit_only_slightly() -> None:
    model = StepLatencyModel()
    for record in varied_records(seed=2, coefficients=TRUE, alpha=0.7, max_k=6, num_steps=2000):
        model.observe(record)
    assert list(model.coefficients().values()) == pytest.approx(TRUE, rel=0.02)


def test_constant_k_stays_identifiable_and_fits_the_data() -> None:
    # Every step drafts 3 with 16 requests: the pass terms are collinear with the intercept, so only the
    # ridge decides how the fixed cost splits. Predictions at the observed shape must still be right.
    rng = random.Random(3)
    records = [
        make_record(
            rng,
            TRUE,
            now_s=step * 0.01,
            k=3,
            num_running=16,
            alpha=0.7,
            num_context_tokens=rng.randint(1_000, 30_000),
            num_prefill_tokens=rng.choice((0, 128, 512)),
        )
        for step in range(500)
    ]
    model = StepLatencyModel()
    for record in records:
        model.observe(record)
    for record in records[-20:]:
        predicted = model.predict(record.num_context_tokens, record.num_batched_tokens, 3, 16)
        assert predicted == pytest.approx(record.duration_s, rel=0.01)
    assert all(value >= 0 for value in model.coefficients().values())


def test_coefficients_are_clipped_non_negative() -> None:
    # Durations that fall as context grows would fit a negative per-token cost; predict must not use it.
    model = StepLatencyModel(prior_weight=1e-6)
    for record in varied_records(
        seed=4, coefficients=(0.05, -1e-6, 20e-6, 1e-3, 1e-5), alpha=0.5, max_k=4, num_steps=200
    ):
        model.observe(record)
    assert model.coefficients()["s_per_context_token"] == 0.0


def test_bad_arguments_name_the_problem() -> None:
    with pytest.raises(ValueError, match="prior needs 5 values"):
        StepLatencyModel(prior=(1.0, 2.0))
    with pytest.raises(ValueError, match="half_life_steps"):
        StepLatencyModel(half_life_steps=0)
    with pytest.raises(ValueError, match="prior_weight"):
        StepLatencyModel(prior_weight=0)
    with pytest.raises(ValueError, match="refit_every=0"):
        StepLatencyModel(HINGED, refit_every=0)
    model = StepLatencyModel(HINGED)
    with pytest.raises(ValueError, match="refit_every=0"):
        model.refit_every = 0


# -- with knots: a step cost that bends at the GPU's ridge point -------------------------------------------------


def test_hinged_fit_follows_a_kinked_step_cost_where_a_line_cannot() -> None:
    hinge, line = StepLatencyModel(HINGED, half_life_steps=1e6), StepLatencyModel(half_life_steps=1e6)
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


def test_hinged_predictions_never_fall_with_more_tokens() -> None:
    model = StepLatencyModel(HINGED)
    rng = random.Random(1)
    for _ in range(500):  # noisy data that, unclipped, would fit negative slopes somewhere
        model.observe(roofline_record(rng.randint(1, 3000), 1, 8, duration_s=rng.uniform(0.01, 0.03)))
    predictions = [model.predict(0, n, 1, 8) for n in range(0, 5000, 50)]
    assert all(b >= a - 1e-12 for a, b in pairwise(predictions))


@pytest.mark.parametrize("features", [LINEAR, HINGED, StepFeatures((100,), ())])
def test_predict_many_and_batched_token_seconds_agree_with_predict(features: StepFeatures) -> None:
    model = StepLatencyModel(features, refit_every=4)
    for step in kinked_steps(200):
        model.observe(step)
    ks = [0, 1, 2, 3, 4]
    many = model.predict_many(700, [300 + 40 * (k + 1) for k in ks], [max(k, 1) for k in ks], 40)
    assert many.tolist() == pytest.approx([model.predict(700, 300 + 40 * (k + 1), max(k, 1), 40) for k in ks])
    assert model.batched_token_seconds(3000) == pytest.approx(model.predict(0, 3000, 0, 0) - model.predict(0, 0, 0, 0))


@pytest.mark.parametrize("features", [LINEAR, HINGED])
def test_predict_shapes_is_predict_many_to_the_bit_across_refits(features: StepFeatures) -> None:
    """The policy prices every k through ``predict_shapes`` each step, keeping what does not depend on the context:
    its numbers must be ``predict_many``'s exactly, also after a refit has changed the coefficients under the key."""
    model = StepLatencyModel(features, refit_every=4)
    ks = np.arange(5)
    for step in kinked_steps(40):
        model.observe(step)
        for batch, context in ((8, step.num_context_tokens), (8, step.num_context_tokens + 97), (3, 50)):
            tokens, passes = 5 + batch + batch * ks, np.maximum(ks, 1).astype(float)
            shapes = model.predict_shapes((batch, 5), context, lambda t=tokens, p=passes: (t, p), batch)
            assert shapes == model.predict_many(context, tokens, passes, batch).tolist()


def test_refit_every_keeps_the_last_solve_for_that_many_steps() -> None:
    model = StepLatencyModel(HINGED, refit_every=4)
    steps = kinked_steps(200)
    for step in steps:
        model.observe(step)
    before = model.coefficients()
    model.observe(steps[0])
    assert model.coefficients() == before  # one step more: the last solve still stands
    for step in steps[1:4]:
        model.observe(step)
    assert model.coefficients() != before


def test_a_longer_refit_interval_set_later_keeps_the_cold_steps_refitting_and_counts_the_stale_steps() -> None:
    model = StepLatencyModel(HINGED, refit_every=2)
    model.refit_every = 8
    versions = []
    for step in kinked_steps(80):
        model.observe(step)
        versions.append(model.fit_version)
    # Cold (until 16 forgotten samples, as the interval it was made with sets) every step asks for a refit; warm,
    # one step in eight.
    assert versions[:10] == list(range(1, 11))
    asked = [i for i, (a, b) in enumerate(pairwise(versions)) if b > a and i >= 40]
    assert len(asked) >= 3 and {b - a for a, b in pairwise(asked)} == {8}
    # Shortened after three steps since the last solve: those count toward the new interval, so the next asks.
    model.coefficients()
    for step in kinked_steps(3):
        model.observe(step)
    model.refit_every = 4
    assert model.observes_until_refit() == 1


def test_steps_folded_in_at_refit_give_the_fit_of_steps_added_one_by_one() -> None:
    every, batched = StepLatencyModel(HINGED, refit_every=1), StepLatencyModel(HINGED, refit_every=8)
    refits, last = 0, batched.coefficients()
    for step in kinked_steps(203):
        assert every.observe(step) > 0 and batched.observe(step) > 0
        current = batched.coefficients()
        if current != last:  # batched just refitted, with every step so far folded into its sums
            refits += 1
            assert list(current.values()) == pytest.approx(list(every.coefficients().values()), rel=1e-9, abs=1e-15)
        last = current
    assert 66 < refits < 90  # the first ~66 steps (until 64 forgotten samples) refit each time, then every 8th


def parted_steps(k: int, num_steps: int, seed: int) -> list[StepRecord]:
    """Decode steps at one k, batch 1-8, whose parts are timed: a target pass of 4 ms + 1.5 ms per token, a draft
    pass of 1 ms + 0.1 ms per request, and 2 ms + 1 ms per request of the loop's own work, each with 2 % noise;
    the cached context (32-600 tokens a request) costs nothing."""
    rng = random.Random(seed)
    out = []
    for step in range(num_steps):
        batch = rng.randint(1, 8)
        tokens = batch * (k + 1)
        forward_s = (4e-3 + 1.5e-3 * tokens) * rng.gauss(1.0, 0.02)
        draft_s = k * (1e-3 + 0.1e-3 * batch) * rng.gauss(1.0, 0.02)
        rest_s = (2e-3 + 1e-3 * batch) * rng.gauss(1.0, 0.02)
        context = sum(rng.randint(32, 600) for _ in range(batch))
        out.append(
            StepRecord(
                now_s=step * 0.05,
                k=k,
                duration_s=forward_s + draft_s + rest_s,
                num_running=batch,
                num_context_tokens=context,
                num_batched_tokens=tokens,
                num_draft_passes=k,
                num_emitted_tokens=2 * batch,
                forward_s=forward_s,
                draft_s=draft_s,
            )
        )
    return out


def draft_pass_s(model: StepLatencyModel, batch: int) -> float:
    """What the model charges one draft pass at ``batch`` requests."""
    c = model.coefficients()
    return c["s_per_draft_pass"] + batch * c["s_per_draft_pass_request"]


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_timed_parts_tell_the_draft_pass_cost_at_one_k(k: int) -> None:
    # Held at one k, a whole step's draft passes move with the batch as its per-request work and verified tokens
    # do, and the fixed share of the passes with the intercept: the whole-step fit cannot tell what a pass costs,
    # which is what a further k adds. The draft's time, taken on its own, tells it.
    records = parted_steps(k, 600, seed=5)
    parted, whole = StepLatencyModel(HINGED), StepLatencyModel(HINGED)
    for record in records:
        parted.observe(record)
        whole.observe(replace(record, forward_s=None, draft_s=None))
    truth_s = 1e-3 + 4 * 0.1e-3
    assert draft_pass_s(parted, 4) == pytest.approx(truth_s, rel=0.05)
    assert abs(draft_pass_s(whole, 4) / truth_s - 1.0) > 0.5


def test_features_without_parts_learn_a_timed_step_whole() -> None:
    records = parted_steps(2, 200, seed=6)
    timed, untimed = StepLatencyModel(LINEAR), StepLatencyModel(LINEAR)
    for record in records:
        timed.observe(record)
        untimed.observe(replace(record, forward_s=None, draft_s=None))
    assert timed.coefficients() == untimed.coefficients()


def explore_every_20th(step: int) -> int:
    """Held at k = 4 as a policy that chose it would be, with an exploration to k = 0, 1, 2 or 3 every 20th step."""
    return (step // 20) % 4 if step % 20 == 19 else 4


def one_request_steps(
    num_steps: int, seed: int, k_at: Callable[[int], int] = explore_every_20th, drafting_rest_s: float = 0.0
) -> list[StepRecord]:
    """One request on a compute-bound engine (a CPU without native bf16): a target pass of 30 ms + 27 ms per scored
    token, a draft pass of 7 ms, 3 ms of the loop's own work (``drafting_rest_s`` more where the draft ran), 2 %
    noise; step i runs k = ``k_at(i)``."""
    rng = random.Random(seed)
    out = []
    for step in range(num_steps):
        k = k_at(step)
        forward_s = (30e-3 + 27e-3 * (k + 1)) * rng.gauss(1.0, 0.02)
        draft_s = k * 7e-3 * rng.gauss(1.0, 0.02)
        rest_s = (3e-3 + (drafting_rest_s if k else 0.0)) * rng.gauss(1.0, 0.02)
        out.append(
            StepRecord(
                now_s=step * 0.2,
                k=k,
                duration_s=forward_s + draft_s + rest_s,
                num_running=1,
                num_context_tokens=32 + 2 * step,
                num_batched_tokens=k + 1,
                num_draft_passes=k,
                num_emitted_tokens=2,
                forward_s=forward_s,
                draft_s=draft_s,
            )
        )
    return out


def test_data_scales_learn_a_steep_token_cost_from_a_few_explorations() -> None:
    # The default ridge weighs the target's per-token slope by a GPU-typical 64 tokens: a 27 ms slope reads as
    # 1.7 s added to a step, and the 5 explorations that vary the tokens do not outweigh the prior. Scaled by the
    # steps this engine runs (1-5 tokens), the same explorations set the slope well enough to choose k.
    records = one_request_steps(100, seed=7)
    gpu_scaled, data_scaled = StepLatencyModel(HINGED), StepLatencyModel(HINGED, data_scales=True)
    for record in records:
        gpu_scaled.observe(record)
        data_scaled.observe(record)
    ks = np.arange(5)
    step_s = 30e-3 + 27e-3 * (ks + 1) + 7e-3 * ks + 3e-3
    tokens = (1 - 0.6 ** (ks + 1)) / (1 - 0.6)  # per step at acceptance 0.6
    true_rate = tokens / step_s

    def chosen_k(model: StepLatencyModel) -> int:
        return int(np.argmax(tokens / model.predict_many(records[-1].num_context_tokens, ks + 1, ks, 1)))

    assert chosen_k(data_scaled) == int(np.argmax(true_rate))
    assert chosen_k(gpu_scaled) == 4
    assert true_rate[4] / true_rate.max() < 0.75, "k = 4 is a poor choice here, not a near-tie"


def test_data_scales_leave_a_feature_never_seen_at_its_prior() -> None:
    # No step has reached the first token knot (32): its increment stays at the prior's zero in either scaling.
    model = StepLatencyModel(HINGED, data_scales=True)
    for record in one_request_steps(60, seed=8):
        model.observe(record)
    assert model.coefficients()["s_per_batched_token_past_32"] == 0.0


def test_data_scales_change_nothing_on_steps_bigger_than_the_typical_one() -> None:
    # Data scales only ever weaken the prior's pull: where every feature of this engine's steps is at least its
    # typical value (64 batched tokens, 8192 context tokens, 4 draft passes, ...) the fit is the default one.
    rng = random.Random(3)
    truth = (4e-3, 2e-7, 30e-6, 1.5e-3, 20e-6)
    default, data_scaled = StepLatencyModel(LINEAR), StepLatencyModel(LINEAR, data_scales=True)
    for _ in range(200):
        batch, k = rng.randint(64, 128), rng.randint(4, 6)
        record = make_record(
            rng, truth, now_s=0.0, k=k, num_running=batch, alpha=0.7, num_context_tokens=rng.randint(8192, 40000)
        )
        default.observe(record)
        data_scaled.observe(record)
    assert data_scaled.coefficients() == pytest.approx(default.coefficients(), rel=1e-9)


def test_a_step_that_skips_the_draft_is_priced_with_its_own_rest() -> None:
    # Where k = 0 skips the draft, a step without draft passes also skips verifying drafts: its loop work is 4 ms
    # less than a speculating step's. Held at k = 2 with an exploration to k = 0 every 10th step, a fit whose rest
    # is one fixed cost charges k = 0 the speculating steps' 6.6 ms on average; with the drafting term, its own.
    model = StepLatencyModel(HINGED, data_scales=True)
    for record in one_request_steps(300, seed=9, k_at=lambda step: 0 if step % 10 == 9 else 2, drafting_rest_s=4e-3):
        model.observe(record)
    c = model.coefficients()
    assert c["rest_intercept_s"] + c["rest_s_per_request"] == pytest.approx(3e-3, rel=0.1)
    assert c["rest_s_when_drafting"] == pytest.approx(4e-3, rel=0.1)
