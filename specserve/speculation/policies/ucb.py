"""Context-free UCB1 over k: the BanditSpec baseline that Nightjar compares against.

BanditSpec (arXiv 2505.15141, ICML 2025: UCBSpec) picks k with a UCB bandit and no batch-size context; Nightjar's
released code runs it as its ``ucb`` strategy ("BanditSpec-style") and rewards every bandit with
``(generated_tokens / B) / elapsed`` per step. With arms k = 0..max_k, n_k plays of arm k, t plays in all and
r_k the mean reward:

    score(k) = r_k / r_max + sqrt(exploration * ln(t) / n_k)

UCB1 (Auer et al., 2002) assumes rewards in [0, 1]; tokens per second are not, so the mean is divided
by the largest single-step reward seen so far (r_max), which keeps the confidence term in the same
unit whatever the hardware. Unplayed arms go first, smallest k first; ties go to the smaller k.
No batch-size context: that is what the baseline lacks (Nightjar §9.1: "its static design ... is
incompatible with the continuous batching of modern serving systems"), and what ``bandit`` adds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specserve.speculation.policies.parts.ties import argmax_smallest
from specserve.speculation.policy import Policy, largest_k, register
from specserve.speculation.types import Decision, EngineTraits, StepContext, StepRecord


@dataclass(frozen=True, slots=True)
class UcbParams:
    # Largest arm; the arms are 0..min(max_k, engine max_k) (None: the engine's). BanditSpec's code uses gamma 1..4.
    max_k: int | None = 4
    # The constant under UCB1's square root: 2 is Auer et al.'s UCB1.
    exploration: float = 2.0

    def __post_init__(self) -> None:
        if self.max_k is not None and self.max_k < 0:
            raise ValueError(f"max_k={self.max_k} must be non-negative")
        if not self.exploration >= 0:
            raise ValueError(f"exploration={self.exploration} must be non-negative")


def step_reward(record: StepRecord) -> float:
    """Tokens per second per request of one step (the bandit reward in Nightjar's released code)."""
    return record.num_emitted_tokens / record.num_running / record.duration_s


def ucb_pick(mean_rewards: Sequence[float], counts: Sequence[int], exploration: float, max_reward: float) -> int:
    """The arm UCB1 plays next: the smallest unplayed arm, else the largest score, ties to smaller k."""
    for arm, count in enumerate(counts):
        if count == 0:
            return arm
    log_total = math.log(sum(counts))
    scale = max_reward if max_reward > 0 else 1.0
    scores = [
        mean / scale + math.sqrt(exploration * log_total / count)
        for mean, count in zip(mean_rewards, counts, strict=True)
    ]
    return argmax_smallest(scores)


@register
class UcbPolicy(Policy):
    """UCB1 over k in 0..max_k on per-request tokens per second; one set of statistics for all batch sizes."""

    name = "ucb"
    Params = UcbParams

    def __init__(self, params: UcbParams, traits: EngineTraits) -> None:
        super().__init__(params, traits)
        self.max_k = largest_k(params.max_k, traits)
        self._counts = [0] * (self.max_k + 1)
        self._means = [0.0] * (self.max_k + 1)
        self._max_reward = 0.0

    def choose(self, ctx: StepContext) -> Decision:
        if not ctx.draft_resident or ctx.num_running == 0:
            return Decision(k=0)
        return Decision(k=ucb_pick(self._means, self._counts, self.params.exploration, self._max_reward))

    def observe(self, record: StepRecord) -> None:
        # Idle or unmeasured steps carry no reward; a k past the arms (another policy's step) is ignored.
        if record.num_running <= 0 or record.duration_s <= 0 or record.k > self.max_k:
            return
        reward = step_reward(record)
        self._counts[record.k] += 1
        self._means[record.k] += (reward - self._means[record.k]) / self._counts[record.k]
        self._max_reward = max(self._max_reward, reward)

    def describe(self) -> dict[str, float]:
        out = {f"mean_reward_tokens_per_s_k{k}": mean for k, mean in enumerate(self._means)}
        out.update({f"num_plays_k{k}": float(count) for k, count in enumerate(self._counts)})
        return out
