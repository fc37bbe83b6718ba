"""PositionAcceptance and expected_tokens: TurboSpec Eq. 4 and the per-position estimate it needs."""

from __future__ import annotations

import random

import pytest
from speculation_synthetic import draw_accepted

from specserve.speculation.estimators.acceptance import PositionAcceptance, expected_tokens
from specserve.speculation.types import StepRecord

# TurboSpec Eq. 4, l(a, k) = (1 - a^(k+1)) / (1 - a), for k = 0..8, two decimals, worked out by hand.
EQ4_TABLE = {
    0.3: (1.00, 1.30, 1.39, 1.42, 1.43, 1.43, 1.43, 1.43, 1.43),
    0.5: (1.00, 1.50, 1.75, 1.88, 1.94, 1.97, 1.98, 1.99, 2.00),
    0.7: (1.00, 1.70, 2.19, 2.53, 2.77, 2.94, 3.06, 3.14, 3.20),
    0.9: (1.00, 1.90, 2.71, 3.44, 4.10, 4.69, 5.22, 5.70, 6.13),
}


def record_of(pairs: list[tuple[int, int]], k: int) -> StepRecord:
    """A step whose requests drafted/accepted as given (timing fields are irrelevant here)."""
    drafted = tuple(d for d, _ in pairs)
    accepted = tuple(a for _, a in pairs)
    return StepRecord(
        now_s=0.0,
        k=k,
        duration_s=0.01,
        num_running=len(pairs),
        num_context_tokens=0,
        num_batched_tokens=sum(drafted) + len(pairs),
        num_draft_passes=k,
        num_emitted_tokens=sum(accepted) + len(pairs),
        num_drafted_per_request=drafted,
        num_accepted_per_request=accepted,
    )


@pytest.mark.parametrize("alpha", sorted(EQ4_TABLE))
def test_expected_tokens_matches_eq4_table(alpha: float) -> None:
    # With no data every position sits at the prior, so the estimator is Eq. 4 with a = prior_alpha.
    estimator = PositionAcceptance(max_k=8, prior_alpha=alpha)
    for k, tabled in enumerate(EQ4_TABLE[alpha]):
        closed_form = (1 - alpha ** (k + 1)) / (1 - alpha)
        assert estimator.expected_tokens(k) == pytest.approx(closed_form, rel=1e-12)
        assert estimator.expected_tokens(k) == pytest.approx(tabled, abs=0.005)


def test_expected_tokens_edges() -> None:
    assert expected_tokens([1.0, 1.0], 5) == 6.0  # a -> 1: k + 1, where Eq. 4 divides by zero
    assert expected_tokens([0.0], 4) == 1.0  # nothing accepted: the bonus token only
    assert expected_tokens([0.5, 0.5], 0) == 1.0
    # Per position: 1 + 0.8 + 0.8 * 0.5 + 0.8 * 0.5 * 0.5 (the last alpha repeats past the end).
    assert expected_tokens([0.8, 0.5], 3) == pytest.approx(2.4)


def test_per_position_counts_only_reached_drafts() -> None:
    # (drafted, accepted): all accepted; two of four; none; one of two (fewer drafts than k); one of one.
    record = record_of([(4, 4), (4, 2), (4, 0), (2, 1), (1, 1)], k=4)
    drafted, reached, accepted = record.per_position(4)
    assert drafted == [5, 4, 3, 3]
    assert reached == [5, 3, 2, 1]
    assert accepted == [4, 2, 1, 1]
    assert record.per_position(2) == ([5, 4], [5, 3], [4, 2])


def test_estimator_on_hand_made_record() -> None:
    estimator = PositionAcceptance(max_k=4, prior_weight=0.0)
    estimator.observe(record_of([(4, 4), (4, 2), (4, 0), (2, 1), (1, 1)], k=4))
    assert estimator.alphas() == pytest.approx([4 / 5, 2 / 3, 1 / 2, 1 / 1])
    # Pooled: A = 8 accepted, F = 3 requests that hit a rejection -> A / (A + F), the truncated-geometric MLE.
    assert estimator.mean_alpha() == pytest.approx(8 / 11)


def test_converges_to_iid_alpha_not_the_biased_ratio() -> None:
    rng = random.Random(7)
    estimator = PositionAcceptance(max_k=5, half_life_steps=20.0)
    num_accepted = num_proposed = 0
    for _ in range(400):
        accepted = tuple(draw_accepted(rng, 0.7, 5) for _ in range(64))
        estimator.observe(record_of([(5, a) for a in accepted], k=5))
        num_accepted, num_proposed = num_accepted + sum(accepted), num_proposed + 5 * len(accepted)
    assert num_accepted / num_proposed == pytest.approx(0.388, abs=0.01)  # the pitfall's ~0.39
    assert estimator.alphas() == pytest.approx([0.7] * 5, abs=0.06)
    assert estimator.mean_alpha() == pytest.approx(0.7, abs=0.02)
    assert estimator.expected_tokens(5) == pytest.approx((1 - 0.7**6) / 0.3, abs=0.15)


def test_unobserved_positions_inherit_the_last_observed_value() -> None:
    estimator = PositionAcceptance(max_k=4, prior_alpha=0.5)
    for _ in range(50):
        estimator.observe(record_of([(2, 2)] * 9 + [(2, 0)], k=2))
    alphas = estimator.alphas()
    assert alphas[0] > 0.85
    assert alphas[2] == pytest.approx(alphas[1]) and alphas[3] == pytest.approx(alphas[1])


def test_step_weight_grows_with_its_samples() -> None:
    few, many = PositionAcceptance(max_k=1), PositionAcceptance(max_k=1)
    few.observe(record_of([(1, 0)], k=1))
    many.observe(record_of([(1, 0)] * 100, k=1))
    assert many.alphas()[0] < few.alphas()[0] < 0.5


def test_forgetting_keeps_the_counts_ratio_and_lets_the_next_verdict_outweigh_them() -> None:
    kept, forgot = PositionAcceptance(max_k=2), PositionAcceptance(max_k=2)
    for estimator in (kept, forgot):
        for _ in range(60):  # one request at a time whose first draft is accepted one step in five
            estimator.observe(record_of([(2, 0)] * 4 + [(2, 2)], k=2))
    before = forgot.alphas()
    forgot.forget(2.0)
    assert forgot.num_reached()[0] == pytest.approx(2.0)
    # The counts keep their ratio; the prior (weight 2) now pulls on them as on two samples.
    assert before[0] < forgot.alphas()[0] < 0.5
    for estimator in (kept, forgot):
        estimator.observe(record_of([(1, 1)], k=1))
    assert forgot.alphas()[0] > 0.4 > kept.alphas()[0]
    with pytest.raises(ValueError, match="max_samples"):
        forgot.forget(-1.0)


def test_steps_without_drafts_change_nothing() -> None:
    estimator = PositionAcceptance(max_k=2)
    estimator.observe(record_of([(1, 1)] * 10, k=1))
    before = estimator.alphas()
    estimator.observe(record_of([], k=0))
    assert estimator.alphas() == before


@pytest.mark.parametrize("kwargs", [{"max_k": 0}, {"max_k": 2, "prior_alpha": 1.5}, {"max_k": 2, "half_life_steps": 0}])
def test_rejects_bad_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        PositionAcceptance(**kwargs)
