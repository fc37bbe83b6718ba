"""A constant speculation length: the static baseline every adaptive policy is compared against."""

from __future__ import annotations

from dataclasses import dataclass

from specserve.speculation.policy import Policy, register
from specserve.speculation.types import Decision, EngineTraits, StepContext


@dataclass(frozen=True, slots=True)
class FixedParams:
    # Draft tokens per request every step; 0 is plain decoding (``fixed:k=0``).
    k: int = 3

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ValueError(f"k={self.k} must be non-negative")


@register
class FixedPolicy(Policy):
    """Always k, except 0 while the draft is not resident (it cannot run then)."""

    name = "fixed"
    Params = FixedParams

    def __init__(self, params: FixedParams, traits: EngineTraits) -> None:
        if params.k > traits.max_k:
            raise ValueError(f"policy 'fixed': k={params.k} exceeds the engine's max_k={traits.max_k}")
        super().__init__(params, traits)

    def choose(self, ctx: StepContext) -> Decision:
        if not ctx.draft_resident:
            return Decision(k=0)
        return Decision(k=min(self.params.k, self.traits.max_k))
