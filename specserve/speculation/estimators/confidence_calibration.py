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

from specserve.speculation.types import StepRecord


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
