"""DSDE's formulas and per-sequence state: calibrated SL_max, WVIR, SF, the predicted SL and the batch cap.

DSDE §III-A (Eqs. 1-8) and §III-C (Eqs. 9-11). The paper gives neither the KLD's direction nor its unit, nor
what one history value is; our choices: KL(target || draft) in nats (``StepRecord.kl_per_request``), and
histories most-recent-first with one value per verification step, that step's mean KLD over the sequence's
drafted positions.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

# Eq. 1's epsilon: keeps the calibration ratio finite when every calibration KLD was 0.
CALIBRATION_EPSILON = 1e-6
# Eq. 3's coefficient: SF = exp(2 mu) - 1, so SF = 1 at mu = ln(2) / 2 = 0.347 nats.
SF_COEFFICIENT = 2.0
# Below this a weighted variance counts as zero (a constant history).
VARIANCE_FLOOR = 1e-12


def calibrated_max_length(max_accepted: float, mean_kld: float, peak_kld: float) -> float:
    """Eq. 1: SL_max = SL_A,max * (1 + mu_pre / (KLD_pre,max + eps)); between SL_A,max and 2 SL_A,max."""
    return max_accepted * (1.0 + mean_kld / (peak_kld + CALIBRATION_EPSILON))


def weighted_variance(values: Sequence[float], decay: float) -> float:
    """Eqs. 5-7: variance with weights decay^(i-1), i = 1 the most recent (first) value."""
    weights = [decay**i for i in range(len(values))]
    total = sum(weights)
    mean = sum(w * v for w, v in zip(weights, values, strict=True)) / total
    return sum(w * (v - mean) ** 2 for w, v in zip(weights, values, strict=True)) / total


def wvir(history: Sequence[float], decay: float, short_window: int, long_window: int) -> float:
    """Eq. 4: Var_w(last short_window) / Var_w(last long_window), most recent first.

    Our choices where the paper is silent: windows use what history exists; fewer than two values, or both
    variances zero, give 1 (neither growing nor settling); a zero long variance alone is padded by 1e-6.
    """
    if len(history) < 2:
        return 1.0
    short = weighted_variance(history[:short_window], decay)
    long = weighted_variance(history[:long_window], decay)
    if short < VARIANCE_FLOOR and long < VARIANCE_FLOOR:
        return 1.0
    return short / (long if long >= VARIANCE_FLOOR else long + 1e-6)


def scale_factor(mean_kld_last: float) -> float:
    """Eq. 3: SF = exp(2 mu_last) - 1, the reaction to the last step's disagreement."""
    return math.exp(SF_COEFFICIENT * mean_kld_last) - 1.0


def predicted_length(sf: float, ratio: float, max_length: float, min_length: float) -> float:
    """Eqs. 2 and 8: (1 - SF * WVIR) * (SL_max - SL_min) + SL_min, or SL_min once the penalty exceeds 1."""
    penalty = sf * ratio
    if penalty > 1.0:
        return float(min_length)
    return (1.0 - penalty) * (max_length - min_length) + min_length


def batch_cap(predictions: Sequence[float]) -> float:
    """Eq. 11: the SL_cap minimising the squared distance to the batch's predictions is their mean."""
    return sum(predictions) / len(predictions)


def round_half_up(value: float) -> int:
    """Nearest integer, halves up (Python's round() sends 2.5 to 2); SLs are never negative."""
    return math.floor(value + 0.5)


@dataclass(slots=True)
class SequenceKld:
    """One sequence's DSDE state: calibration counters, then the KLD history and its current SL-hat."""

    calibration_steps: int
    history_len: int
    num_steps: int = 0
    max_accepted: int = 0
    kld_sum: float = 0.0
    kld_count: int = 0
    kld_peak: float = 0.0
    # Eq. 1's result once calibrated; None while calibrating.
    max_length: float | None = None
    history: deque[float] = field(default_factory=deque)
    # SL-hat from the latest step, recomputed on every observed step (None while calibrating).
    predicted: float | None = None

    def observe(self, klds: Sequence[float], num_accepted: int) -> None:
        """Fold in one verified step: per-position KLDs of its drafts and how many were accepted."""
        self.history.appendleft(sum(klds) / len(klds))
        while len(self.history) > self.history_len:
            self.history.pop()
        if self.max_length is None:
            self.num_steps += 1
            self.max_accepted = max(self.max_accepted, num_accepted)
            self.kld_sum += sum(klds)
            self.kld_count += len(klds)
            self.kld_peak = max(self.kld_peak, max(klds))
            if self.num_steps >= self.calibration_steps:
                mean = self.kld_sum / self.kld_count
                self.max_length = calibrated_max_length(self.max_accepted, mean, self.kld_peak)
