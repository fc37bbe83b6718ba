"""A scripted k sequence, one entry per step, repeated: for tests and for timing each k in place.

``cycle:ks=4-0-2`` runs k=4, then 0, then 2, then 4 again... Greedy output must not depend on it,
which is what the engine tests use it to prove.
"""

from __future__ import annotations

from dataclasses import dataclass

from specserve.speculation.policy import Policy, register
from specserve.speculation.types import Decision, EngineTraits, StepContext


@dataclass(frozen=True, slots=True)
class CycleParams:
    # k values separated by "-" (a "," would end the parameter in a policy spec).
    ks: str = "0-1-2-3-4"

    def __post_init__(self) -> None:
        ks = self.values()
        if not ks or any(k < 0 for k in ks):
            raise ValueError(f"ks={self.ks!r} must be non-negative integers joined by '-'")

    def values(self) -> tuple[int, ...]:
        try:
            return tuple(int(part) for part in self.ks.split("-"))
        except ValueError:
            raise ValueError(f"ks={self.ks!r} must be non-negative integers joined by '-'") from None


@register
class CyclePolicy(Policy):
    name = "cycle"
    Params = CycleParams

    def __init__(self, params: CycleParams, traits: EngineTraits) -> None:
        self._ks = params.values()
        if max(self._ks) > traits.max_k:
            raise ValueError(f"policy 'cycle': k={max(self._ks)} exceeds the engine's max_k={traits.max_k}")
        super().__init__(params, traits)
        self._step = 0

    def choose(self, ctx: StepContext) -> Decision:
        k = self._ks[self._step % len(self._ks)]
        self._step += 1
        return Decision(k=k if ctx.draft_resident else 0)
