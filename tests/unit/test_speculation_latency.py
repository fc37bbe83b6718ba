"""StepLatencyModel: research/turbospec.md §2.3 Eq. 3, extended with the draft's passes, fitted online."""

from __future__ import annotations

import random

import pytest
from speculation_synthetic import make_record, varied_records

from specserve.speculation.latency import COEFFICIENT_NAMES, DEFAULT_PRIOR, StepLatencyModel, solve_linear

# Deliberately far from DEFAULT_PRIOR in every coefficient.
TRUE = (8e-3, 0.3e-6, 45e-6, 2.5e-3, 4e-6)


def test_predicts_the_prior_before_data() -> None:
    model = StepLatencyModel()
    assert model.coefficients() == pytest.approx(dict(zip(COEFFICIENT_NAMES, DEFAULT_PRIOR)))
    # 5 ms + 1000 * 1 us + 40 * 20 us + 2 * 1 ms + 2 * 8 * 10 us
    assert model.predict(1000, 40, 2, 8) == pytest.approx(8.96e-3)


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
        make_record(rng, TRUE, now_s=step * 0.01, k=3, num_running=16, alpha=0.7,
                    num_context_tokens=rng.randint(1_000, 30_000), num_prefill_tokens=rng.choice((0, 128, 512)))
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
    for record in varied_records(seed=4, coefficients=(0.05, -1e-6, 20e-6, 1e-3, 1e-5), alpha=0.5,
                                 max_k=4, num_steps=200):
        model.observe(record)
    assert model.coefficients()["s_per_context_token"] == 0.0


def test_solve_linear() -> None:
    assert solve_linear([[0.0, 2.0], [3.0, 1.0]], [4.0, 5.0]) == pytest.approx([1.0, 2.0])


def test_the_unified_model_without_knots_predicts_what_the_linear_model_did() -> None:
    """Old (pure-Python Gaussian elimination) against new (numpy, no knots) on random steps: equal to rounding."""
    from specserve.speculation.estimators.step_latency import LINEAR
    from specserve.speculation.estimators.step_latency import StepLatencyModel as Unified

    old, new = StepLatencyModel(), Unified(LINEAR)
    rng = random.Random(7)
    worst = 0.0
    for record in varied_records(seed=5, coefficients=TRUE, alpha=0.6, max_k=6, num_steps=1500):
        shape = (rng.randint(0, 50_000), rng.randint(1, 4096), rng.randint(0, 8), rng.randint(1, 256))
        a, b = old.predict(*shape), new.predict(*shape)
        worst = max(worst, abs(a - b) / a)
        old.observe(record)
        new.observe(record)
        assert list(new.coefficients()) == list(old.coefficients())
    assert worst < 1e-12, worst
    print("worst relative difference", worst)
