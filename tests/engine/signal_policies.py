"""User policies that look at the draft's confidences on the real engine (loaded through ``policy_modules``)."""

from __future__ import annotations

from dataclasses import dataclass

from specserve.speculation.policy import Policy, register
from specserve.speculation.types import Decision, StepContext, StepRecord


@dataclass(frozen=True, slots=True)
class FixedKParams:
    k: int = 4


@register
class SignalRecorder(Policy):
    """Fixed k; reports the confidences and entropies it was shown, split by the drafts' fate."""

    name = "test-signal-recorder"
    Params = FixedKParams

    def __init__(self, params: FixedKParams, traits) -> None:
        super().__init__(params, traits)
        self.sums = {"accepted": 0.0, "rejected": 0.0, "accepted_n": 0, "rejected_n": 0, "entropy_min": 1e9}
        self.misaligned = 0

    def choose(self, ctx: StepContext) -> Decision:
        return Decision(k=self.params.k)

    def observe(self, record: StepRecord) -> None:
        if not record.draft_confidence_per_request:
            return
        per_request = zip(
            record.num_drafted_per_request,
            record.num_accepted_per_request,
            record.draft_confidence_per_request,
            record.draft_entropy_per_request,
            strict=True,
        )
        for drafted, accepted, confidences, entropies in per_request:
            if len(confidences) != drafted or len(entropies) != drafted:
                self.misaligned += 1
                continue
            for position, confidence in enumerate(confidences[: accepted + 1]):
                fate = "accepted" if position < accepted else "rejected"
                self.sums[fate] += confidence
                self.sums[f"{fate}_n"] += 1
            self.sums["entropy_min"] = min(self.sums["entropy_min"], *entropies)

    def describe(self) -> dict[str, float]:
        return {**{key: float(value) for key, value in self.sums.items()}, "misaligned": float(self.misaligned)}


@dataclass(frozen=True, slots=True)
class ThresholdParams:
    k: int = 4
    threshold: float = 0.9


class _Threshold:
    """SpecDec++'s stopping rule at a fixed threshold: stop after the first position the draft was unsure of."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold

    def after_pass(self, position: int, confidence: float) -> bool:
        return confidence < self.threshold


@register
class ThresholdPolicy(Policy):
    name = "test-threshold"
    Params = ThresholdParams

    def choose(self, ctx: StepContext) -> Decision:
        return Decision(k=self.params.k, draft_stop=_Threshold(self.params.threshold))
