"""Statistics of a policy comparison: medians over rounds and bootstrap intervals of ratios.

The unit of replication is a round: every policy runs once per round, back to back, so a round is
one paired observation. Slow drift of the machine (another job, thermal state, a cache warming)
moves every policy of a round alike, and a per-round ratio cancels it; that is why ratios are
formed within a round and only then summarised.

- A policy's value at a load point is the median of its per-round values.
- Its ratio to the best fixed policy is the median over rounds of (policy / best fixed) in that
  round. "Best fixed" is the fixed policy with the best median (highest throughput, lowest latency).
- The 95 % interval is a percentile bootstrap over rounds: resample round indices with
  replacement, the same indices for every policy (keeping the pairing), pick the best fixed policy
  again within each resample (so the interval also carries the uncertainty of which fixed k is
  best), recompute the ratio. numpy's seeded generator makes it reproducible.

With few rounds the median of a resample can only take a few values, so the interval is coarse
(with 5 rounds it is about the range of the per-round ratios); more rounds narrow it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_RESAMPLES = 10_000
LEVEL = 0.95


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    label: str
    # Where a `bench run` report keeps it, first choice first: a report without the first (an open loop, or one
    # written before it existed) has the next.
    paths: tuple[tuple[str, str], ...]
    higher_is_better: bool


METRICS = {
    m.name: m
    for m in (
        # A closed loop's steady rate, its drain left out (report.window), where the run has one.
        Metric(
            "tok_s", "output tok/s", (("window", "output_tokens_per_s"), ("throughput", "output_tokens_per_s")), True
        ),
        Metric("e2e", "mean E2E ms", (("e2e_ms", "mean"),), False),
        Metric("tpot", "mean TPOT ms", (("tpot_ms", "mean"),), False),
        Metric("ttft", "mean TTFT ms", (("ttft_ms", "mean"),), False),
    )
}


def metric_value(summary: dict[str, Any], metric: Metric) -> float:
    value = None
    for section, key in metric.paths:
        if (part := summary.get(section)) is not None:
            value = part[key]
            break
    return float("nan") if value is None else float(value)


def by_round(
    runs: Sequence[dict[str, Any]], policies: Sequence[str], value: Callable[[dict[str, Any]], float]
) -> np.ndarray:
    """(policies, rounds) of one load point's runs (`bench compare` records), ``value`` of each run's report,
    over the rounds every policy completed."""
    by_key = {(r["policy"], r["round"]): value(r["report"]) for r in runs}
    rounds = sorted({rnd for (_, rnd) in by_key})
    complete = [rnd for rnd in rounds if all((p, rnd) in by_key for p in policies)]
    return np.array([[by_key[(p, rnd)] for rnd in complete] for p in policies], dtype=np.float64)


@dataclass(frozen=True, slots=True)
class Interval:
    value: float
    low: float
    high: float

    def excludes(self, x: float) -> bool:
        return self.low > x or self.high < x

    @property
    def width(self) -> float:
        return self.high - self.low


def _bounds(samples: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(samples, [tail, 100.0 - tail], axis=-1)
    return low, high


# Two-sided 95 % Student t quantiles by degrees of freedom (no scipy in the product's dependencies).
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23}


def mean_interval(values: Sequence[float]) -> Interval:
    """The mean of a few paired values (seeds, rounds) and its 95 % t interval (beyond 10 values, the normal's)."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) < 2:
        return Interval(float(x.mean()), -np.inf, np.inf)
    half = T95.get(len(x) - 1, 1.96) * float(x.std(ddof=1)) / np.sqrt(len(x))
    return Interval(float(x.mean()), float(x.mean() - half), float(x.mean() + half))


def median_interval(values: Sequence[float], resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> Interval:
    """The median of per-round values and its bootstrap interval."""
    x = np.asarray(values, dtype=np.float64)
    idx = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))
    low, high = _bounds(np.median(x[idx], axis=1), LEVEL)
    return Interval(float(np.median(x)), float(low), float(high))


def ratios_to_best(
    values: np.ndarray,
    baselines: Sequence[int],
    higher_is_better: bool,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    level: float = LEVEL,
) -> tuple[int, list[Interval]]:
    """Each row's ratio to the best baseline row, with paired bootstrap intervals.

    ``values`` is (policies, rounds): entry [p, r] is policy p's value in round r. ``baselines`` are the
    rows that may be "best" (the fixed policies). Returns the best baseline row on all rounds and one
    interval per row. The best is picked within rounds too (``best_row``), so drift between rounds does not
    pick it.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2 or v.shape[1] == 0 or not baselines:
        raise ValueError("need a (policies, rounds) array with at least one round and one baseline row")
    rows = np.asarray(baselines)

    best = int(rows[best_row(v[rows], higher_is_better)])
    point = np.median(v / v[best], axis=1)

    num_rounds = v.shape[1]
    idx = np.random.default_rng(seed).integers(0, num_rounds, size=(resamples, num_rounds))
    sampled = v[:, idx]  # (policies, resamples, rounds)
    best_each = rows[best_row(sampled[rows], higher_is_better)]  # (resamples,)
    base = sampled[best_each, np.arange(resamples)]  # (resamples, rounds)
    low, high = _bounds(np.median(sampled / base, axis=2), level)
    return best, [Interval(float(p), float(lo), float(hi)) for p, lo, hi in zip(point, low, high, strict=True)]


def best_row(values: np.ndarray, higher_is_better: bool) -> np.ndarray | int:
    """The row no other row beats within rounds: the one whose worst median per-round ratio against another row
    (the ratio the page reports for that row) is the best, so a page never shows a fixed row above 1 where another
    beats none. ``values`` is (rows, ..., rounds); one index per leading batch entry.

    Medians of the raw values would let the rounds' drift choose: with the machine slower in the last rounds,
    a row that was close behind in the fast rounds and ahead in one slow round can have the higher median
    while the other beat it in most rounds (on one 8-round comparison, k = 3's median 40.1 tok/s against k = 4's
    39.1, k = 4 faster in 6 of the 8 rounds and by 1.07 x in the median round).
    """
    v = np.maximum(values, np.finfo(np.float64).tiny)
    # [r, b, ...]: the median over rounds of row r's value over row b's.
    ratios = np.median(v[:, None] / v[None, :], axis=-1)
    sign = 1.0 if higher_is_better else -1.0
    worst = np.max(sign * np.log(ratios), axis=0)  # [b, ...]: how far the best rival of b is ahead of it
    best = np.argmin(worst, axis=0)
    return int(best) if np.ndim(best) == 0 else best


def settled(interval: Interval, width: float) -> bool:
    """Enough rounds for a claim: the interval excludes 1 (a difference) or is narrower than ``width``
    (no difference larger than about width / 2)."""
    return interval.excludes(1.0) or interval.width < width


def spread(values: Sequence[float], digits: int = 3) -> dict[str, float]:
    """Median, min and max of a few repeated measurements, rounded: how benchmark scripts report rounds."""
    return {
        "median": round(float(np.median(values)), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }
