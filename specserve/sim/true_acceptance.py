"""Which drafts the target accepts: per-request alpha, per-position decay, regime changes.

Each request draws its own alpha at arrival from Beta(mean * c, (1 - mean) * c), where the mean is the
regime in force at its arrival time (a workload shift such as TurboSpec's Sonnet -> ShareGPT at 60 s,
TurboSpec §8.1, Fig. 15b), or from the request's kind where the workload mixes kinds (``AcceptanceConfig.classes``:
a copy-heavy edit accepts nearly every draft, a free-form answer few). Draft j of a request (0-based) is accepted
with probability alpha * decay**j, independently; the request keeps the longest accepted prefix (Leviathan et al.'s
i.i.d. model behind TurboSpec Eq. 4 when decay = 1).
"""

from __future__ import annotations

import numpy as np

from specserve.sim.config import AcceptanceConfig


class TrueAcceptance:
    """The simulated ground truth: each request's alpha and every draft's verdict (policies only estimate it)."""

    def __init__(self, cfg: AcceptanceConfig, max_k: int) -> None:
        self._starts_s = np.array([0.0] + [r.start_s for r in cfg.regimes])
        self._means = np.array([cfg.mean] + [r.mean for r in cfg.regimes])
        self._concentration = cfg.concentration
        self._class_shares = np.array([c.share for c in cfg.classes])
        self._class_means = np.array([c.mean for c in cfg.classes])
        # Multiplier per draft position, shape (max_k,).
        self.position_factors = cfg.decay ** np.arange(max(max_k, 1), dtype=np.float64)

    def draw_alphas(self, arrival_s: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One alpha per request, from the regime in force at its arrival."""
        if len(self._class_means):
            means = self._class_means[rng.choice(len(self._class_means), size=len(arrival_s), p=self._class_shares)]
        else:
            means = self._means[np.searchsorted(self._starts_s, arrival_s, side="right") - 1]
        if self._concentration is None:
            return means.astype(np.float64)
        # Beta needs both shapes > 0; a mean of exactly 0 or 1 means every alpha is that value.
        inner = (means > 0) & (means < 1)
        c = self._concentration
        alphas = means.astype(np.float64).copy()
        alphas[inner] = rng.beta(means[inner] * c, (1 - means[inner]) * c)
        return alphas

    def draw_alphas_by_regime(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """Shape (regimes, count): each of ``count`` requests' alpha under every regime, for requests whose
        arrival is not known when they are drawn (a closed loop's)."""
        return np.stack([self.draw_alphas(np.full(count, start_s), rng) for start_s in self._starts_s])

    def regime(self, time_s: float) -> int:
        """The index of the regime in force at ``time_s``."""
        return int(np.searchsorted(self._starts_s, time_s, side="right")) - 1

    def position_probs(self, alphas: np.ndarray, num_positions: int) -> np.ndarray:
        """Acceptance probability per request and draft position, shape (len(alphas), num_positions)."""
        return alphas[:, None] * self.position_factors[:num_positions]

    def sample_passed(
        self, probs: np.ndarray, num_drafts: np.ndarray, rng: np.random.Generator, uniform: bool = False
    ) -> np.ndarray:
        """Independent verdicts per position (bool, shape of probs); False past a request's own num_drafts.
        ``uniform``: the caller knows every request drafts every position (nothing to cut)."""
        passed = rng.random(probs.shape) < probs
        if not uniform:
            # A request given fewer drafts than the widest row (cap or token budget) cannot accept past its own.
            passed &= np.arange(probs.shape[1]) < num_drafts[:, None]
        return passed

    def sample_accepted(self, alphas: np.ndarray, num_drafts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Accepted-prefix length per request, 0..num_drafts[i]; both arrays are aligned, num_drafts >= 1."""
        passed = self.sample_passed(self.position_probs(alphas, int(num_drafts.max())), num_drafts, rng)
        return accepted_prefix(passed)


def accepted_prefix(passed: np.ndarray) -> np.ndarray:
    """Per row, the number of leading True verdicts: the target keeps the longest accepted prefix."""
    width = passed.shape[1]
    if not width:
        return np.zeros(len(passed), dtype=np.int64)
    # The first rejection's position, or the width where there is none: the cumulative product's sum, in fewer
    # passes over the array (this runs once per simulated step).
    return np.where(np.logical_and.reduce(passed, axis=1), width, passed.argmin(axis=1))
