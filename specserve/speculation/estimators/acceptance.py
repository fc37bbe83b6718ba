"""Online estimate of per-position draft acceptance and the expected tokens per step.

TurboSpec's Eq. 4 (§4.1.3), l(a, k) = (1 - a^(k+1)) / (1 - a), needs a *conditional* per-position
acceptance rate. Prefix-accepted / proposed is biased low (about 0.39 for a = 0.7, k = 5), so we count,
per position j, only drafts whose whole prefix was accepted (``StepRecord.per_position``'s ``reached``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from specserve.speculation.types import StepRecord


def expected_tokens(alphas: Sequence[float], k: int) -> float:
    """Expected tokens one request emits in a step with k drafts, bonus token included.

    ``1 + sum_{j<k} prod_{i<=j} alphas[i]``: draft j is kept only if drafts 0..j all are. With every
    alpha equal to a this is TurboSpec Eq. 4, (1 - a^(k+1)) / (1 - a), without its a -> 1 singularity.
    Positions past the end of ``alphas`` reuse its last value (1.0 assumed when it is empty).
    """
    return expected_tokens_upto(alphas, k)[k]


def expected_tokens_upto(alphas: Sequence[float], max_k: int) -> list[float]:
    """``expected_tokens(alphas, k)`` for k = 0 .. max_k: the same sums, taken once."""
    out, total, survive = [1.0], 1.0, 1.0
    for pos in range(max_k):
        survive *= alphas[min(pos, len(alphas) - 1)] if alphas else 1.0
        total += survive
        out.append(total)
    return out


class PositionAcceptance:
    """Exponentially forgotten per-position acceptance counts with a shrinkage prior.

    Each observed step decays the sums once and adds its counts, so a step with many samples moves the estimate
    more than a step with few: TurboSpec's "weighted average from these past rates" (§4.1.3), with a prior for
    the cold start, which the paper leaves open. Position j is shrunk toward the estimate at j-1 (position 0
    toward ``prior_alpha``): deep positions are rarely reached, and with no samples there they inherit the last
    well-observed value instead of snapping back to the prior.
    """

    def __init__(
        self,
        max_k: int,
        half_life_steps: float = 20.0,
        prior_alpha: float = 0.5,
        prior_weight: float = 2.0,
    ) -> None:
        if max_k < 1:
            raise ValueError(f"max_k={max_k} must be at least 1")
        if not half_life_steps > 0:
            raise ValueError(f"half_life_steps={half_life_steps} must be positive")
        if not 0.0 <= prior_alpha <= 1.0:
            raise ValueError(f"prior_alpha={prior_alpha} must lie in [0, 1]")
        if prior_weight < 0:
            raise ValueError(f"prior_weight={prior_weight} must be non-negative")
        self.max_k = max_k
        self.prior_alpha = prior_alpha
        # In samples (request-positions): how strongly the prior pulls a position with little data.
        self.prior_weight = prior_weight
        # Per-step multiplier on the sums: old evidence halves every half_life_steps observed steps.
        self._decay = math.pow(0.5, 1.0 / half_life_steps)
        self._accepted = [0.0] * max_k
        self._reached = [0.0] * max_k
        self._alphas = self._solve()

    def observe(self, record: StepRecord) -> None:
        """Fold in one step's verdicts; steps without drafts carry no evidence and are skipped."""
        if record.num_drafted == 0:
            return
        _, reached, accepted = record.per_position(self.max_k)
        decay = self._decay
        self._accepted = [decay * old + new for old, new in zip(self._accepted, accepted, strict=True)]
        self._reached = [decay * old + new for old, new in zip(self._reached, reached, strict=True)]
        self._alphas = self._solve()

    def seed(self, accepted: Sequence[float], reached: Sequence[float]) -> None:
        """Add evidence gathered elsewhere (a peer replica's decayed counts), as if observed before the first step;
        positions past ``max_k`` are dropped, missing ones get none. Later steps decay it like any other."""
        if len(accepted) != len(reached):
            raise ValueError(f"accepted ({len(accepted)}) and reached ({len(reached)}) differ in length")
        for pos, (a, r) in enumerate(zip(accepted[: self.max_k], reached[: self.max_k], strict=True)):
            if not (math.isfinite(a) and math.isfinite(r) and 0.0 <= a <= r):
                raise ValueError(
                    f"position {pos}: accepted {a} and reached {r} must be finite, 0 <= accepted <= reached"
                )
            self._accepted[pos] += a
            self._reached[pos] += r
        self._alphas = self._solve()

    def forget(self, max_samples: float) -> None:
        """Scale the evidence down to at most ``max_samples`` at position 0, keeping its ratios (the prior then pulls
        on it as on that many samples): what comes next outweighs it (the requests it came from have left)."""
        if not max_samples >= 0:
            raise ValueError(f"max_samples={max_samples} must be non-negative")
        if self._reached[0] <= max_samples:
            return
        factor = max_samples / self._reached[0]
        self._accepted = [a * factor for a in self._accepted]
        self._reached = [r * factor for r in self._reached]
        self._alphas = self._solve()

    def accepted_counts(self) -> list[float]:
        """Decayed accepted count per position (with ``num_reached``, the evidence ``seed`` takes)."""
        return list(self._accepted)

    def alphas(self) -> list[float]:
        """Conditional acceptance rate per position 0..max_k-1, each in [0, 1]."""
        return list(self._alphas)

    def mean_alpha(self) -> float:
        """One pooled rate: sum accepted / sum reached over positions, with the prior.

        Pooled over positions this is the truncated-geometric maximum-likelihood estimate A / (A + F), A the
        accepted drafts and F the requests that hit a rejection: every request reaches its accepted positions
        plus the one it failed at, if any.
        """
        accepted, reached = sum(self._accepted), sum(self._reached)
        denominator = reached + self.prior_weight
        if denominator <= 0:
            return self.prior_alpha
        return (accepted + self.prior_weight * self.prior_alpha) / denominator

    def expected_tokens(self, k: int) -> float:
        """Expected tokens per request per step for k drafts (Eq. 4 generalised per position)."""
        return expected_tokens(self._alphas, k)

    def expected_tokens_upto(self, max_k: int) -> list[float]:
        """``expected_tokens(k)`` for k = 0 .. max_k, in one pass."""
        return expected_tokens_upto(self._alphas, max_k)

    def num_reached(self) -> list[float]:
        """Decayed sample count per position: how much evidence each alpha rests on."""
        return list(self._reached)

    def _solve(self) -> list[float]:
        alphas, previous = [], self.prior_alpha
        for accepted, reached in zip(self._accepted, self._reached, strict=True):
            denominator = reached + self.prior_weight
            previous = (accepted + self.prior_weight * previous) / denominator if denominator > 0 else previous
            alphas.append(previous)
        return alphas


def pooled_evidence(
    peers: Sequence[tuple[Sequence[float], Sequence[float]]],
) -> tuple[tuple[float, ...], tuple[float, ...], int] | None:
    """Peers' acceptance evidence (decayed accepted and reached counts per position) as one typical peer's worth:
    the average over the peers that have any, on the positions they all have; with how many they are. None
    without evidence. What a replica new to its deployment is seeded with (``PositionAcceptance.seed``): the
    controller keeps the same average as running sums, the simulator computes it here at a scale-out."""
    with_evidence = [(a, r) for a, r in peers if any(r)]
    width = min((len(r) for _, r in with_evidence), default=0)
    if not width:
        return None
    n = len(with_evidence)
    accepted = tuple(sum(a[p] for a, _ in with_evidence) / n for p in range(width))
    reached = tuple(sum(r[p] for _, r in with_evidence) / n for p in range(width))
    return accepted, reached, n
