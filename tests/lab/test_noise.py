"""The noise a comparison reads against: estimated from pages, and what it makes of a policy that is exactly as
good as the best fixed k (``lab.instruments.noise``)."""

from __future__ import annotations

import numpy as np

from lab.instruments.noise import equal_policy_readings, per_run_spreads


def page(values: np.ndarray, policies: list[str]) -> dict:
    runs = [
        {"point": "c", "round": r, "policy": p, "report": {"throughput": {"output_tokens_per_s": float(values[i, r])}}}
        for i, p in enumerate(policies)
        for r in range(values.shape[1])
    ]
    return {"policies": policies, "points": [{"label": "c"}], "runs": runs}


def test_the_spread_of_one_run_is_recovered_from_fixed_pairs_and_drift_between_rounds_cancels():
    rng = np.random.default_rng(1)
    drift = np.linspace(0.6, 1.4, 400)  # hits every policy of a round alike
    rates = np.array([[100.0], [130.0], [90.0]]) * drift * np.exp(rng.normal(0.0, 0.05, (3, 400)))
    spreads = per_run_spreads([page(rates, ["fixed:k=1", "fixed:k=2", "adaptive"])])
    assert len(spreads) == 1, "one pair of fixed policies; the learning policy is not a pair's member"
    assert abs(spreads[0] - 0.05) < 0.005
    assert per_run_spreads([page(rates[:, :2], ["fixed:k=1", "fixed:k=2", "adaptive"])]) == []


def test_a_policy_as_good_as_the_best_reads_below_it_when_fixed_ks_tie_the_winners_curse():
    rng = np.random.default_rng(2)
    alone = equal_policy_readings(0.06, tied=1, rounds=8, trials=400, resamples=50, rng=rng)[:, 0]
    three = equal_policy_readings(0.06, tied=3, rounds=8, trials=400, resamples=50, rng=rng)[:, 0]
    # One fixed policy: nothing to pick, the reading is centred on the truth.
    assert abs(np.mean(alone) - 1.0) < 0.01
    # Three tied: the one picked is the one the noise favoured, and the equal policy reads below it.
    assert np.mean(three) < np.mean(alone) - 0.005
    assert np.mean(three < 0.97) > np.mean(alone < 0.97)
