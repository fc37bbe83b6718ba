"""The weighted closest non-decreasing sequence (``estimators.monotone``)."""

from __future__ import annotations

import random

import pytest

from specserve.speculation.estimators.monotone import nondecreasing


def test_an_ordered_sequence_is_its_own_projection() -> None:
    assert nondecreasing([1.0, 2.0, 2.0, 5.0], [1.0, 3.0, 1.0, 2.0]) == [1.0, 2.0, 2.0, 5.0]


def test_violators_pool_to_their_weighted_mean() -> None:
    # 57 (weight 20) above 45 (weight 3): both become (57 * 20 + 45 * 3) / 23.
    out = nondecreasing([38.0, 46.0, 52.0, 57.0, 45.0], [5.0, 5.0, 5.0, 20.0, 3.0])
    assert out[:3] == [38.0, 46.0, 52.0]
    assert out[3] == out[4] == pytest.approx((57.0 * 20 + 45.0 * 3) / 23)


def test_the_projection_is_ordered_and_keeps_the_weighted_sum() -> None:
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 9)
        values = [rng.uniform(-5, 5) for _ in range(n)]
        weights = [rng.uniform(0.1, 10) for _ in range(n)]
        out = nondecreasing(values, weights)
        assert all(b >= a - 1e-12 for a, b in zip(out, out[1:], strict=False))
        assert sum(w * v for w, v in zip(weights, out, strict=True)) == pytest.approx(
            sum(w * v for w, v in zip(weights, values, strict=True))
        )


def test_bad_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="weights"):
        nondecreasing([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="positive"):
        nondecreasing([1.0, 2.0], [1.0, 0.0])
