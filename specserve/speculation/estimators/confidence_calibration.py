"""How often a draft of a given confidence is accepted: the draft's confidence, calibrated online.

AdaSpec (§4.2, Eq. 7) reads the draft's probability of the token it drafted as that token's acceptance
probability. That holds for a draft distilled to match its target; a draft that is a cheap cut of the target
(fewer layers, another training run) is systematically over- or under-confident, and a rule that trusts raw
confidences then stops too early or too late. SpecDec++ trains its stopping head on the target's verdicts for the
same reason. This estimator keeps, per confidence bin, exponentially forgotten counts of drafts that reached
verification (their whole prefix accepted) and of those accepted, shrunk toward the raw confidence so that a bin
with no evidence reads as the draft says; a rule asks it for the acceptance a confidence stands for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from specserve.speculation.types import StepRecord

# Requests in a step from which ``observe`` counts with arrays rather than a loop per draft: the arrays' fixed cost
# is about a few dozen drafts' loop.
VECTOR_MIN_REQUESTS = 32


class ConfidenceCalibration:
    """Per-bin acceptance of drafts by their confidence, forgetting with a half-life in steps."""

    def __init__(self, num_bins: int = 10, half_life_steps: float = 200.0, prior_weight: float = 4.0) -> None:
        if num_bins < 1:
            raise ValueError(f"num_bins={num_bins} must be at least 1")
        if not half_life_steps > 0:
            raise ValueError(f"half_life_steps={half_life_steps} must be positive")
        if prior_weight < 0:
            raise ValueError(f"prior_weight={prior_weight} must be non-negative")
        self.num_bins = num_bins
        self.prior_weight = prior_weight
        self._decay = math.exp(-math.log(2.0) / half_life_steps)
        self._reached = [0.0] * num_bins
        self._accepted = [0.0] * num_bins

    def _bin(self, confidence: float) -> int:
        return min(self.num_bins - 1, max(0, int(confidence * self.num_bins)))

    def observe(self, record: StepRecord) -> None:
        """Every verified draft whose prefix was accepted counts in its confidence's bin, accepted or not."""
        if not record.draft_confidence_per_request:
            return
        reached = self._reached = [r * self._decay for r in self._reached]
        accepted_ = self._accepted = [a * self._decay for a in self._accepted]
        if len(record.draft_confidence_per_request) >= VECTOR_MIN_REQUESTS and self._observe_table(record):
            return
        # ``_bin`` inlined and a rejected draft's 0.0 not added (x + 0.0 is x): every step runs this per draft.
        num_bins, top = self.num_bins, self.num_bins - 1
        per_request = zip(record.num_accepted_per_request, record.draft_confidence_per_request, strict=False)
        for accepted, confidences in per_request:
            for position, confidence in enumerate(confidences[: accepted + 1]):
                b = int(confidence * num_bins)
                b = top if b > top else (0 if b < 0 else b)
                reached[b] += 1.0
                if position < accepted:
                    accepted_[b] += 1.0

    def _observe_table(self, record: StepRecord) -> bool:
        """``observe``'s counting for a large batch whose requests drafted alike, as arrays; False (nothing counted)
        where the confidences are not such a table of probabilities, for the loop to count them as it does.

        Each count is still one addition of 1.0 to its bin in the loop's order (``np.add.at`` is unbuffered), so the
        sums are the loop's to the last bit."""
        accepted = record.num_accepted_per_request
        if len(accepted) != len(record.draft_confidence_per_request):
            return False
        try:
            table = np.array(record.draft_confidence_per_request, dtype=np.float64)
        except ValueError:  # ragged: requests drafted different numbers of tokens
            return False
        # Outside [0, 1] (or NaN) the loop's int() and the cast below could part ways: the loop decides there.
        if table.ndim != 2 or not (table.min(initial=0.0) >= 0.0 and table.max(initial=0.0) <= 1.0):
            return False
        bins = (table * self.num_bins).astype(np.int64)
        np.minimum(bins, self.num_bins - 1, out=bins)
        positions = np.arange(table.shape[1])
        counts = np.array(accepted, dtype=np.int64)[:, None]
        reached, accepted_ = np.array(self._reached), np.array(self._accepted)
        np.add.at(reached, bins[positions <= counts], 1.0)
        np.add.at(accepted_, bins[positions < counts], 1.0)
        self._reached, self._accepted = reached.tolist(), accepted_.tolist()
        return True

    def acceptance(self, confidence: float) -> float:
        """The acceptance a draft of this confidence has had, the confidence itself where nothing was seen."""
        # ``_bin`` inlined: a draft-loop rule asks after every pass.
        b = int(confidence * self.num_bins)
        top = self.num_bins - 1
        b = top if b > top else (0 if b < 0 else b)
        weight = self._reached[b] + self.prior_weight
        return (self._accepted[b] + self.prior_weight * confidence) / weight if weight > 0 else confidence

    def table(self) -> list[tuple[float, float, float]]:
        """Per bin: (its lower edge, drafts seen (decayed), their acceptance)."""
        return [
            (b / self.num_bins, self._reached[b], self.acceptance((b + 0.5) / self.num_bins))
            for b in range(self.num_bins)
        ]

    def seen(self) -> float:
        return sum(self._reached)


def calibrated(calibration: ConfidenceCalibration | None, confidences: Sequence[float]) -> list[float]:
    """``confidences`` as acceptances; unchanged without a calibration."""
    if calibration is None:
        return list(confidences)
    return [calibration.acceptance(c) for c in confidences]
