"""Online linear model of one engine step's wall time.

research/turbospec.md §2.3, Eq. 3: T_fwd = alpha_kv * N_context + gamma * N_batched + delta, fitted
offline per (model, GPU, TP). We fit it online instead, from the engine's own step records, and extend it
with the draft's cost (Eq. 2, T_batch = T_draft + T_target): each sequential draft pass costs a constant
plus a per-request term, so

    T_step = c0 + c1 * N_context + c2 * N_batched + c3 * passes + c4 * passes * B

The fit is exponentially forgotten least squares with a ridge pull toward a prior coefficient vector. The
prior is all the model knows before data arrives; afterwards it only keeps the fit identifiable along
directions the data never varies (e.g. a policy that always picks the same k cannot separate the
intercept from the per-pass cost on its own).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from specserve.speculation.types import StepRecord

COEFFICIENT_NAMES = (
    "intercept_s",
    "s_per_context_token",
    "s_per_batched_token",
    "s_per_draft_pass",
    "s_per_draft_pass_request",
)
# A small engine's step, used only until data arrives: 5 ms fixed (weights, launch, Python), 1 us per
# cached context token (attention reads), 20 us per batched token, 1 ms per draft pass, and 10 us per
# request in each draft pass. research/feasibility-2.md measured ~2 ms for the first draft pass plus
# bookkeeping and ~0.7 ms per further pass on its small model: the same order.
DEFAULT_PRIOR = (5e-3, 1e-6, 20e-6, 1e-3, 10e-6)
# Typical feature values of one step (B ~ 16-64, a few thousand cached tokens, k ~ 2-4). The ridge
# weighs each coefficient's distance from the prior by the seconds it would move such a step, so one
# prior_weight means the same thing for every coefficient whatever its unit.
DEFAULT_FEATURE_SCALES = (1.0, 8192.0, 64.0, 4.0, 64.0)


def features(
    num_context_tokens: float, num_batched_tokens: float, num_draft_passes: float, num_running: float
) -> list[float]:
    """The regressors of the model above, in ``COEFFICIENT_NAMES`` order."""
    passes = float(num_draft_passes)
    return [1.0, float(num_context_tokens), float(num_batched_tokens), passes, passes * float(num_running)]


class StepLatencyModel:
    """Predicts a step's seconds from its shape; learns from every ``StepRecord``."""

    def __init__(
        self,
        prior: Sequence[float] = DEFAULT_PRIOR,
        half_life_steps: float = 1000.0,
        prior_weight: float = 1.0,
        feature_scales: Sequence[float] = DEFAULT_FEATURE_SCALES,
    ) -> None:
        if len(prior) != len(COEFFICIENT_NAMES) or len(feature_scales) != len(COEFFICIENT_NAMES):
            raise ValueError(f"prior and feature_scales need {len(COEFFICIENT_NAMES)} values")
        if not half_life_steps > 0:
            raise ValueError(f"half_life_steps={half_life_steps} must be positive")
        if not prior_weight > 0:
            raise ValueError(f"prior_weight={prior_weight} must be positive: it keeps the fit identifiable")
        self._scales = [float(s) for s in feature_scales]
        # The fit runs in scaled units (feature / scale, coefficient * scale) so the 5x5 system is well
        # conditioned although the raw features span 1 to ~1e5.
        self._prior_scaled = [c * s for c, s in zip(prior, self._scales)]
        # Equivalent number of steps the prior counts for, per coefficient.
        self._prior_weight = prior_weight
        self._decay = math.pow(0.5, 1.0 / half_life_steps)
        n = len(COEFFICIENT_NAMES)
        self._gram = [[0.0] * n for _ in range(n)]  # forgotten sum of z z^T
        self._moment = [0.0] * n  # forgotten sum of z * duration_s
        self._num_samples = 0.0
        self._coefficients = self._solve()

    def observe(self, record: StepRecord) -> None:
        x = features(record.num_context_tokens, record.num_batched_tokens, record.num_draft_passes, record.num_running)
        z = [value / scale for value, scale in zip(x, self._scales)]
        decay = self._decay
        for i, zi in enumerate(z):
            row = self._gram[i]
            for j, zj in enumerate(z):
                row[j] = decay * row[j] + zi * zj
            self._moment[i] = decay * self._moment[i] + zi * record.duration_s
        self._num_samples = decay * self._num_samples + 1.0
        self._coefficients = None  # solved lazily: many observes may come between predictions

    def predict(
        self, num_context_tokens: int, num_batched_tokens: int, num_draft_passes: int, num_running: int
    ) -> float:
        """Predicted step seconds; coefficients are clipped at 0, so adding work never lowers it."""
        x = features(num_context_tokens, num_batched_tokens, num_draft_passes, num_running)
        return sum(c * v for c, v in zip(self._current(), x))

    def coefficients(self) -> dict[str, float]:
        """The clipped coefficients ``predict`` uses, by name, in seconds per unit of each feature."""
        return dict(zip(COEFFICIENT_NAMES, self._current()))

    @property
    def num_samples(self) -> float:
        """Decayed count of observed steps: how much the fit rests on data rather than the prior."""
        return self._num_samples

    def _current(self) -> list[float]:
        if self._coefficients is None:
            self._coefficients = self._solve()
        return self._coefficients

    def _solve(self) -> list[float]:
        """Ridge solution (G + w I) phi = m + w phi_prior, unscaled and clipped non-negative."""
        w = self._prior_weight
        matrix = [
            [g + (w if i == j else 0.0) for j, g in enumerate(row)] for i, row in enumerate(self._gram)
        ]
        rhs = [m + w * p for m, p in zip(self._moment, self._prior_scaled)]
        phi = solve_linear(matrix, rhs)
        # Clipping after the unconstrained solve is not the constrained optimum, but a negative fitted
        # cost is noise and must not make bigger steps look cheaper.
        return [max(0.0, p / s) for p, s in zip(phi, self._scales)]


def solve_linear(matrix: list[list[float]], rhs: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting on a small dense system (mutates its inputs)."""
    n = len(rhs)
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(matrix[r][col]))
        if matrix[pivot][col] == 0.0:
            raise ValueError("singular system")
        matrix[col], matrix[pivot] = matrix[pivot], matrix[col]
        rhs[col], rhs[pivot] = rhs[pivot], rhs[col]
        for row in range(col + 1, n):
            factor = matrix[row][col] / matrix[col][col]
            if factor:
                for j in range(col, n):
                    matrix[row][j] -= factor * matrix[col][j]
                rhs[row] -= factor * rhs[col]
    solution = [0.0] * n
    for row in reversed(range(n)):
        tail = sum(matrix[row][j] * solution[j] for j in range(row + 1, n))
        solution[row] = (rhs[row] - tail) / matrix[row][row]
    return solution
