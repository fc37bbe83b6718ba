"""What a comparison can resolve on a noisy machine: each run's noise estimated from committed comparisons, and
the ratio `bench compare` reports for a policy exactly as good as the best fixed k under that noise.

With several fixed policies tied for best, the one picked as best is the one the noise favoured in those
rounds, so a policy equal to it reads below 1 on average (the winner's curse) and below a bar in some share of
invocations; ``equal_policy_readings`` measures both with the same statistics every results page uses."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from specserve.bench.compare import fixed_rows, point_policies, round_matrix
from specserve.bench.stats import METRICS, ratios_to_best

#: Fewer rounds than this say little about a pair's spread.
MIN_ROUNDS_FOR_SPREAD = 3


def per_run_spreads(documents: Iterable[dict[str, Any]]) -> list[float]:
    """One run's noise (log scale), once per pair of fixed policies at every load point: the standard deviation
    over rounds of the log of their per-round ratio, ÷ sqrt 2 (each run of the pair adds its own)."""
    spreads = []
    for document in documents:
        for point in document["points"]:
            policies = point_policies(document, point)
            fixed = [policies[i] for i in fixed_rows(policies)]
            logs = np.log(round_matrix(document["runs"], point["label"], fixed, METRICS["tok_s"]))
            if logs.shape[1] < MIN_ROUNDS_FOR_SPREAD:
                continue
            for i in range(len(fixed)):
                for j in range(i + 1, len(fixed)):
                    spreads.append(float(np.std(logs[i] - logs[j], ddof=1) / np.sqrt(2)))
    return spreads


def equal_policy_readings(
    sigma: float, tied: int, rounds: int, trials: int, resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """(trials, 2): the median ratio to the best fixed and its interval's low end that `bench compare` reports
    for a policy with the same true rate as ``tied`` fixed policies, each run's rate off by log-normal noise."""
    out = np.empty((trials, 2))
    for t in range(trials):
        values = np.exp(rng.normal(0.0, sigma, (tied + 1, rounds)))
        _, intervals = ratios_to_best(values, list(range(tied)), True, resamples, seed=t)
        out[t] = intervals[-1].value, intervals[-1].low
    return out
