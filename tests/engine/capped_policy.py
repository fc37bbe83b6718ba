"""A user policy loaded through ``policy_modules``: k = 4, but every other running request capped at 1."""

from __future__ import annotations

from dataclasses import dataclass

from specserve.speculation.policy import Policy, register
from specserve.speculation.types import Decision, StepContext


@dataclass(frozen=True, slots=True)
class CappedParams:
    k: int = 4
    cap: int = 1


@register
class AlternateCapPolicy(Policy):
    name = "test-alternate-cap"
    Params = CappedParams

    def choose(self, ctx: StepContext) -> Decision:
        caps = tuple((rid, self.params.cap) for rid in sorted(ctx.request_ids)[::2])
        return Decision(k=self.params.k, max_k_per_request=caps)
