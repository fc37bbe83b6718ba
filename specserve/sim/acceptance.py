"""Which drafts the target accepts: per-request alpha, per-position decay, regime changes.

Each request draws its own alpha at arrival from Beta(mean * c, (1 - mean) * c), where the mean is the
regime in force at its arrival time (a workload shift such as TurboSpec's Sonnet -> ShareGPT at 60 s,
research/turbospec.md §4.3). Draft j of a request (0-based) is accepted with probability
alpha * decay**j, independently; the request keeps the longest accepted prefix (Leviathan et al.'s
i.i.d. model behind TurboSpec Eq. 4 when decay = 1).
"""

from __future__ import annotations

import numpy as np

from specserve.sim.config import AcceptanceConfig


class AcceptanceModel:
    def __init__(self, cfg: AcceptanceConfig, max_k: int) -> None:
        self._starts_s = np.array([0.0] + [r.start_s for r in cfg.regimes])
        self._means = np.array([cfg.mean] + [r.mean for r in cfg.regimes])
        self._concentration = cfg.concentration
        # Multiplier per draft position, shape (max_k,).
        self.position_factors = cfg.decay ** np.arange(max(max_k, 1), dtype=np.float64)

    def draw_alphas(self, arrival_s: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One alpha per request, from the regime in force at its arrival."""
        means = self._means[np.searchsorted(self._starts_s, arrival_s, side="right") - 1]
        if self._concentration is None:
            return means.astype(np.float64)
        # Beta needs both shapes > 0; a mean of exactly 0 or 1 means every alpha is that value.
        inner = (means > 0) & (means < 1)
        c = self._concentration
        alphas = means.astype(np.float64).copy()
        alphas[inner] = rng.beta(means[inner] * c, (1 - means[inner]) * c)
        return alphas

    def sample_accepted(self, alphas: np.ndarray, num_drafts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Accepted-prefix length per request, 0..num_drafts[i]; both arrays are aligned, num_drafts >= 1."""
        k = int(num_drafts.max())
        passed = rng.random((len(alphas), k)) < alphas[:, None] * self.position_factors[:k]
        # A request given fewer than k drafts (the token budget cut it) cannot accept past its own.
        passed &= np.arange(k) < num_drafts[:, None]
        return np.cumprod(passed, axis=1).sum(axis=1)
