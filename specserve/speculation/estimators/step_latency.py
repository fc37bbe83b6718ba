"""Online piecewise-linear model of one engine step's wall time: a linear fit with hinges.

``latency.StepLatencyModel`` (TurboSpec Eq. 3 extended with draft passes) is linear in batched tokens. A GPU
step is not: below the ridge point (about peak FLOPs / (2 x bandwidth) tokens: ~300 on an H100, ~200 on an
A100, ~165 on an RTX 4090, whatever the model size) reading the weights dominates and extra tokens are
nearly free; above it every token costs its FLOPs. A straight line through both regimes overprices k at
small batches and underprices it at large ones: on nightjar-l20x2-32b-dynamic the linear fit chose k = 2
where k = 4 was best at batch 1-8 and k = 1 where 0 was best at batch 128+.

So the batched-token term is a linear spline: slope ``s0`` plus an increment past each knot (hinge
features ``max(0, N - knot)``), and the per-request cost of a draft pass gets the same treatment in the
batch size. Knots sit at powers of two that bracket every ridge point of the GPUs we profile; their
increments start at zero (the prior is the straight line) and the fit moves them only where data demands.
Cumulative slopes are clipped at zero after the solve, so adding tokens never lowers the prediction.

Fitted like the linear model: exponentially forgotten least squares with a ridge toward the prior, in
scaled units. It uses numpy (17 x 17 normal equations per prediction would cost ~0.3 ms in pure Python).
"""

from __future__ import annotations

import math

import numpy as np

from specserve.speculation.types import StepRecord

# Batched-token knots: prefill chunks reach the budget (2048-8192), decodes B * (k + 1).
TOKEN_KNOTS = (32, 64, 128, 256, 512, 1024, 2048, 4096)
# Batch-size knots for the per-request cost of each draft pass (the draft's ridge point in requests).
REQUEST_KNOTS = (16, 64, 128, 256, 512)

BASE_NAMES = ("intercept_s", "s_per_context_token", "s_per_batched_token")
DRAFT_NAMES = ("s_per_draft_pass", "s_per_draft_pass_request")
# Prior: a small engine's step (latency.DEFAULT_PRIOR) with no kinks.
BASE_PRIOR = (5e-3, 1e-6, 20e-6)
DRAFT_PRIOR = (1e-3, 10e-6)


def _hinges(value: float, knots: tuple[int, ...]) -> list[float]:
    return [max(0.0, value - knot) for knot in knots]


def features(num_context_tokens: float, num_batched_tokens: float, num_draft_passes: float, num_running: float) -> list[float]:
    """Regressors in the order [1, ctx, N, N hinges..., passes, passes * B, passes * B hinges...]."""
    n, passes, b = float(num_batched_tokens), float(num_draft_passes), float(num_running)
    return [
        1.0, float(num_context_tokens), n, *_hinges(n, TOKEN_KNOTS),
        passes, passes * b, *(passes * h for h in _hinges(b, REQUEST_KNOTS)),
    ]


_TOKEN_KNOTS = np.array(TOKEN_KNOTS, dtype=np.float64)
_REQUEST_KNOTS = np.array(REQUEST_KNOTS, dtype=np.float64)
_NUM_TOKEN = len(TOKEN_KNOTS)
_NUM_REQUEST = len(REQUEST_KNOTS)
_PRIOR = np.array([*BASE_PRIOR, *[0.0] * _NUM_TOKEN, *DRAFT_PRIOR, *[0.0] * _NUM_REQUEST])
# Typical magnitude of each feature: the ridge then weighs every coefficient by the seconds it moves a
# typical step, whatever its unit (latency.DEFAULT_FEATURE_SCALES).
_SCALES = np.array([1.0, 8192.0, 64.0, *[float(k) for k in TOKEN_KNOTS], 4.0, 64.0, *[4.0 * k for k in REQUEST_KNOTS]])
# Slices of the two splines: slope then increments.
_TOKEN_SPLINE = slice(2, 3 + _NUM_TOKEN)
_REQUEST_SPLINE = slice(4 + _NUM_TOKEN, 5 + _NUM_TOKEN + _NUM_REQUEST)


class HingeLatencyModel:
    """Predicts a step's seconds from its shape; learns from every ``StepRecord``."""

    def __init__(self, half_life_steps: float = 1000.0, prior_weight: float = 1.0, refit_every: int = 8) -> None:
        if not half_life_steps > 0:
            raise ValueError(f"half_life_steps={half_life_steps} must be positive")
        if not prior_weight > 0:
            raise ValueError(f"prior_weight={prior_weight} must be positive: it keeps the fit identifiable")
        if refit_every < 1:
            raise ValueError(f"refit_every={refit_every} must be at least 1")
        # The solve is most of the model's cost per step. With a half-life of hundreds of steps, coefficients a
        # few steps old predict as well; the first steps after a cold start are refitted every time. Steps seen
        # since the last solve wait in _pending and join the sums in one product when the next solve needs them.
        self._refit_every = refit_every
        self._stale = 0
        self._pending: list[tuple[np.ndarray, float]] = []
        self._decay = math.pow(0.5, 1.0 / half_life_steps)
        self._prior_weight = prior_weight
        n = len(_PRIOR)
        self._gram = np.zeros((n, n))
        self._moment = np.zeros(n)
        self._num_samples = 0.0
        self._coefficients: np.ndarray | None = None

    def observe(self, record: StepRecord) -> float:
        """Learn from one step. Returns the seconds the model predicted for it before learning from it."""
        raw = np.array(features(record.num_context_tokens, record.num_batched_tokens, record.num_draft_passes,
                                record.num_running))
        predicted_s = float(raw @ self._current())
        self._pending.append((raw, record.duration_s))
        self._num_samples = self._decay * self._num_samples + 1.0
        self._stale += 1
        if self._stale >= self._refit_every or self._num_samples < 8 * self._refit_every:
            self._coefficients = None
        return predicted_s

    def predict(self, num_context_tokens: float, num_batched_tokens: float, num_draft_passes: float,
                num_running: float) -> float:
        x = features(num_context_tokens, num_batched_tokens, num_draft_passes, num_running)
        return float(np.dot(self._current(), x))

    def predict_many(self, num_context_tokens: float, num_batched_tokens: np.ndarray, num_draft_passes: np.ndarray,
                     num_running: float) -> np.ndarray:
        """``predict`` for several shapes at once that share the context and the batch (one row per k).

        The same linear form, grouped: fixed cost and context once, the token spline per row, and one draft pass
        at this batch size times each row's passes.
        """
        phi = self._current()
        n = np.asarray(num_batched_tokens, dtype=np.float64)
        b = float(num_running)
        per_pass_s = phi[3 + _NUM_TOKEN] + phi[4 + _NUM_TOKEN] * b + float(
            phi[5 + _NUM_TOKEN:] @ np.maximum(b - _REQUEST_KNOTS, 0.0))
        tokens_s = phi[2] * n + np.maximum(n[:, None] - _TOKEN_KNOTS, 0.0) @ phi[3:3 + _NUM_TOKEN]
        return phi[0] + phi[1] * float(num_context_tokens) + tokens_s + per_pass_s * np.asarray(num_draft_passes)

    def batched_token_seconds(self, num_batched_tokens: float) -> float:
        """What ``num_batched_tokens`` add to a step on their own: the token spline, without the fixed cost."""
        n = float(num_batched_tokens)
        spline = self._current()[_TOKEN_SPLINE]
        return float(spline[0] * n + np.dot(spline[1:], np.maximum(n - _TOKEN_KNOTS, 0.0)))

    def coefficients(self) -> dict[str, float]:
        """Coefficients by name; the spline increments are named by their knot."""
        names = [*BASE_NAMES, *(f"s_per_batched_token_past_{k}" for k in TOKEN_KNOTS), *DRAFT_NAMES,
                 *(f"s_per_draft_pass_request_past_{k}" for k in REQUEST_KNOTS)]
        return dict(zip(names, self._current().tolist()))

    @property
    def num_samples(self) -> float:
        return self._num_samples

    def _current(self) -> np.ndarray:
        if self._coefficients is None:
            self._coefficients = self._solve()
            self._stale = 0
        return self._coefficients

    def _fold_pending(self) -> None:
        """Decay the sums once per pending step and add the steps, the oldest decayed most."""
        m = len(self._pending)
        if not m:
            return
        x = np.array([raw for raw, _ in self._pending]) / _SCALES
        y = np.array([duration for _, duration in self._pending])
        weighted = x * (self._decay ** np.arange(m - 1, -1, -1))[:, None]
        keep = self._decay ** m
        self._gram = keep * self._gram + weighted.T @ x
        self._moment = keep * self._moment + weighted.T @ y
        self._pending.clear()

    def _solve(self) -> np.ndarray:
        self._fold_pending()
        w = self._prior_weight
        prior_scaled = _PRIOR * _SCALES
        phi = np.linalg.solve(self._gram + w * np.eye(len(_PRIOR)), self._moment + w * prior_scaled) / _SCALES
        phi[:2] = np.maximum(phi[:2], 0.0)
        phi[3 + _NUM_TOKEN] = max(phi[3 + _NUM_TOKEN], 0.0)
        phi[_TOKEN_SPLINE] = _monotone_spline(phi[_TOKEN_SPLINE])
        phi[_REQUEST_SPLINE] = _monotone_spline(phi[_REQUEST_SPLINE])
        return phi


def _monotone_spline(coefficients: np.ndarray) -> np.ndarray:
    """Slope then increments, adjusted so every segment's slope is non-negative: a fitted negative cost
    is noise and must not make a bigger step look cheaper."""
    slopes = np.maximum(np.cumsum(coefficients), 0.0)
    increments = slopes.copy()
    increments[1:] -= slopes[:-1]
    return increments
