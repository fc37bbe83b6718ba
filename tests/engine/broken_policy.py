"""A user policy loaded through ``policy_modules`` that fails in every way the engine's guard absorbs.

Over each cycle of five steps ``choose`` raises, answers k=99 (above any engine's max_k), answers k=NaN, then
twice answers ``k`` (real speculation between the failures); every third ``observe`` raises; ``describe``
reports a NaN estimate beside a finite one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specserve.speculation.policy import Policy, register
from specserve.speculation.types import Decision, StepContext, StepRecord


@dataclass(frozen=True, slots=True)
class BrokenParams:
    k: int = 3


@register
class BrokenPolicy(Policy):
    name = "test-broken"
    Params = BrokenParams

    def __init__(self, params: BrokenParams, traits) -> None:
        super().__init__(params, traits)
        self.num_chosen = 0
        self.num_observed = 0

    def choose(self, ctx: StepContext) -> Decision:
        self.num_chosen += 1
        phase = self.num_chosen % 5
        if phase == 0:
            raise RuntimeError("broken policy: choose failed on purpose")
        if phase == 1:
            return Decision(k=99)
        if phase == 2:
            return Decision(k=math.nan)  # type: ignore[arg-type]
        return Decision(k=self.params.k)

    def observe(self, record: StepRecord) -> None:
        self.num_observed += 1
        if self.num_observed % 3 == 0:
            raise ValueError("broken policy: observe failed on purpose")

    def describe(self) -> dict[str, float]:
        return {"estimate": math.nan, "num_chosen": float(self.num_chosen)}
