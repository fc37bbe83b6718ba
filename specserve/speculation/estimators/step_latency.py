"""Online model of one engine step's wall time, linear in its features, with optional hinges.

TurboSpec (§4.1.3, Eq. 3) prices a forward pass as T_fwd = alpha * N_context + gamma * N_batched + delta, fitted
offline per model and GPU. We fit it online, from the engine's own step records, and add the draft's cost
(Eq. 2, T_batch = T_draft + T_target): each sequential draft pass costs a constant plus a per-request term, so

    T_step = c0 + c1 * N_context + s(N_batched) + passes * (d0 + r(B))

``s`` and ``r`` are linear splines: a slope, plus an increment past each knot (hinge features max(0, x - knot)).
With ``parts`` (``HINGED`` has them) the step's own work outside both models' passes gets its terms,
``+ e0 + e1 * B + e2 * [passes > 0]`` (scheduling, sampling, output processing per request, and verifying drafts
where the draft ran), and a step whose parts were timed where they ran (``StepRecord.forward_s`` and ``draft_s``)
teaches each part on its own: the target's pass ``c0 + c1 * N_context + s(N_batched)``, the draft's passes
``passes * (d0 + r(B))``, the rest ``e0 + e1 * B + e2 * [passes > 0]``. Without ``e2`` a policy that speculates
prices a step that skips the draft with the rest of a speculating one: on a served CPU engine at one request, 2-4
ms of a 45-60 ms step. ``e2`` is identified only once the fit has seen steps both with and without the draft;
until then the ridge splits the rest's excess over its prior between ``e0`` and ``e2``. A
whole step cannot tell them apart while it runs one k: the draft's passes, the target's verified tokens and the
per-request work then all move with B alone, and the ridge splits them by its prior. Held at one k on a served CPU
engine, the whole-step fit priced each further k 1.2-3 x what it cost; a part timed on its own is identified at
any k.
``StepFeatures`` says where the knots are. ``LINEAR`` has none: TurboSpec's straight line, used by ``goodput``,
``slo`` and ``mlp``. ``HINGED`` (used by ``adaptive``) bends, because a GPU step does: below the ridge point
(about peak FLOPs / (2 x bandwidth) tokens: ~300 on an H100, ~200 on an A100, ~165 on an RTX 4090, whatever the
model size) reading the weights dominates and extra tokens are nearly free; above it every token costs its
FLOPs. A straight line through both regimes overprices k at small batches and underprices it at large ones: on
the simulator's nightjar-l20x2-32b-dynamic scenario it chose k = 2 where k = 4 was best at batch 1-8, and k = 1
where 0 was best at batch 128+. The knots sit at powers of two that bracket the ridge points of the GPUs we
profile; their increments start at zero (the prior is the straight line), and the fit moves them only where
the data demands.

The fit is exponentially forgotten least squares with a ridge pull toward a prior coefficient vector, in scaled
units (feature / typical value) so the normal equations stay well conditioned although raw features span 1 to
~1e5. The prior is all the model knows before data arrives; afterwards it keeps the fit identifiable along
directions the data never varies (a policy that always picks the same k cannot separate the intercept from the
per-pass cost on its own). Fitted slopes are clipped so that adding work never lowers a prediction: clipping
after the unconstrained solve is not the constrained optimum, but a negative fitted cost is noise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from specserve.speculation.types import StepRecord

BASE_NAMES = ("intercept_s", "s_per_context_token", "s_per_batched_token")
DRAFT_NAMES = ("s_per_draft_pass", "s_per_draft_pass_request")
# A small engine's step, used only until data arrives: 5 ms fixed (weights, launch, Python), 1 us per cached
# context token (attention reads), 20 us per batched token, 1 ms per draft pass and 10 us per request in each
# draft pass. Measured on a 2-core CPU with a tiny draft/target pair, the first draft pass plus bookkeeping took
# ~2 ms and each further pass ~0.7 ms: the same order.
BASE_PRIOR = (5e-3, 1e-6, 20e-6)
DRAFT_PRIOR = (1e-3, 10e-6)
# Typical feature values of one step (B ~ 16-64, a few thousand cached tokens, k ~ 2-4). The ridge weighs each
# coefficient's distance from the prior by the seconds it would move such a step, so one prior_weight means the
# same thing for every coefficient whatever its unit. A hinge's typical value is its knot.
BASE_SCALES = (1.0, 8192.0, 64.0)
DRAFT_SCALES = (4.0, 64.0)
# The step's work outside both models' passes: a fixed part, one per running request, and one more where the draft
# ran (verifying drafts, the proposer's bookkeeping), as measured where the parts are timed (about 2 ms of a 60 ms
# step at 4 requests on a 2-core CPU, and 2-4 ms more for a speculating step than for one that skipped the draft).
# The intercept's prior gives up the fixed part's; the drafting part's prior is none, as on a GPU profile.
REST_NAMES = ("rest_intercept_s", "rest_s_per_request", "rest_s_when_drafting")
REST_PRIOR = (1e-3, 20e-6, 0.0)
REST_SCALES = (1.0, 64.0, 1.0)
# Batched-token knots: prefill chunks reach the budget (2048-8192), decodes B * (k + 1).
TOKEN_KNOTS = (32, 64, 128, 256, 512, 1024, 2048, 4096)
# Batch-size knots for the per-request cost of each draft pass (the draft's ridge point in requests).
REQUEST_KNOTS = (16, 64, 128, 256, 512)


@dataclass(frozen=True, slots=True)
class StepFeatures:
    """The regressors [1, ctx, N, N hinges..., passes, passes * B, passes * B hinges...] for given knots, then
    [1, B, passes > 0] for the rest of the step where ``parts``."""

    token_knots: tuple[int, ...] = ()
    request_knots: tuple[int, ...] = ()
    # Whether the fit has the rest's terms and learns each timed part on its own (module docstring).
    parts: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        """Coefficient names in regressor order; a spline increment is named by its knot."""
        return (
            *BASE_NAMES,
            *(f"s_per_batched_token_past_{k}" for k in self.token_knots),
            *DRAFT_NAMES,
            *(f"s_per_draft_pass_request_past_{k}" for k in self.request_knots),
            *(REST_NAMES if self.parts else ()),
        )

    def default_prior(self) -> tuple[float, ...]:
        """The straight line of ``BASE_PRIOR`` and ``DRAFT_PRIOR`` (and ``REST_PRIOR``, out of the intercept's):
        every increment starts at zero."""
        base = (BASE_PRIOR[0] - REST_PRIOR[0], *BASE_PRIOR[1:]) if self.parts else BASE_PRIOR
        rest = REST_PRIOR if self.parts else ()
        return (*base, *[0.0] * len(self.token_knots), *DRAFT_PRIOR, *[0.0] * len(self.request_knots), *rest)

    def scales(self) -> tuple[float, ...]:
        return (
            *BASE_SCALES,
            *map(float, self.token_knots),
            *DRAFT_SCALES,
            *(DRAFT_SCALES[0] * k for k in self.request_knots),
            *(REST_SCALES if self.parts else ()),
        )

    def row(
        self, num_context_tokens: float, num_batched_tokens: float, num_draft_passes: float, num_running: float
    ) -> list[float]:
        n, passes, b = float(num_batched_tokens), float(num_draft_passes), float(num_running)
        # Built with comprehensions rather than starred generators: a policy builds one row per step. ``x if x > 0.0
        # else 0.0`` is max(0.0, x) (NaN included) without the call.
        row = [1.0, float(num_context_tokens), n]
        row += [x if x > 0.0 else 0.0 for x in [n - knot for knot in self.token_knots]]
        row += [passes, passes * b]
        row += [passes * (x if x > 0.0 else 0.0) for x in [b - knot for knot in self.request_knots]]
        if self.parts:
            row += [1.0, b, float(passes > 0)]
        return row

    def part_masks(self) -> np.ndarray:
        """Rows of 0/1 over the regressors, one per part (target, draft, rest): a whole step's row times them gives
        the part's row, and the three sum to the row; their targets are the step's timed parts."""
        draft = 3 + len(self.token_knots)
        rest = draft + 2 + len(self.request_knots)
        columns = np.arange(len(self.names))
        bounds = ((0, draft), (draft, rest), (rest, rest + len(REST_NAMES)))
        return np.array([(lo <= columns) & (columns < hi) for lo, hi in bounds])


#: TurboSpec's straight line (Eq. 3 plus draft passes).
LINEAR = StepFeatures()
#: Splines in batched tokens and in the draft pass's batch size, and the step's parts.
HINGED = StepFeatures(TOKEN_KNOTS, REQUEST_KNOTS, parts=True)


class StepLatencyModel:
    """Predicts a step's seconds from its shape; learns from every ``StepRecord``."""

    def __init__(
        self,
        features: StepFeatures = LINEAR,
        *,
        prior: Sequence[float] | None = None,
        half_life_steps: float = 1000.0,
        prior_weight: float = 1.0,
        refit_every: int = 1,
        data_scales: bool = False,
    ) -> None:
        """``data_scales``: weigh each coefficient's distance from the prior by the seconds it would move the steps
        this engine has run (each feature's forgotten root mean square) where those are smaller than a GPU-typical
        step's (``StepFeatures.scales``: 64 batched tokens, 16-64 requests). At one request on a compute-bound CPU
        a scored token costs tens of ms; scaled for 64 tokens that slope reads as seconds added to a step, and the
        few steps that vary the tokens never outweigh the prior. The scales only shrink: on steps as big as the
        typical one the fit is the default's, so a GPU engine at high load keeps the pull it was tuned with."""
        prior = features.default_prior() if prior is None else tuple(prior)
        if len(prior) != len(features.names):
            raise ValueError(f"prior needs {len(features.names)} values, one per coefficient")
        if not half_life_steps > 0:
            raise ValueError(f"half_life_steps={half_life_steps} must be positive")
        if not prior_weight > 0:
            raise ValueError(f"prior_weight={prior_weight} must be positive: it keeps the fit identifiable")
        _check_refit_every(refit_every)
        self.features = features
        num_tokens, num_requests = len(features.token_knots), len(features.request_knots)
        self._token_knots = np.array(features.token_knots, dtype=np.float64)
        self._request_knots = np.array(features.request_knots, dtype=np.float64)
        self._pass = 3 + num_tokens  # index of the per-pass constant
        self._token_spline = slice(2, 3 + num_tokens)  # slope, then increments
        self._request_spline = slice(4 + num_tokens, 5 + num_tokens + num_requests)
        self._scales = np.array(features.scales())
        # With data scales the sums are kept in raw units and scaled at each solve by the scales of the moment.
        self._data_scales = data_scales
        self._fold_scales = np.ones(len(prior)) if data_scales else self._scales
        self._squares = np.zeros(len(prior))  # forgotten sum of each whole-step feature squared
        self._part_masks = features.part_masks() if features.parts else None
        self._prior = np.array(prior)
        self._prior_weight = prior_weight
        self._ridge = prior_weight * np.eye(len(prior))  # the solve's pull toward the prior, made once
        self._decay = math.pow(0.5, 1.0 / half_life_steps)
        # The solve is most of the model's cost per step. With a half-life of hundreds of steps, coefficients a few
        # steps old predict as well; the first steps after a cold start are refitted every time. Steps seen since
        # the last solve wait in _pending and join the sums in one product when the next solve needs them.
        self._refit_every = refit_every
        # Until the fit rests on this many steps it refits at every step, whatever ``refit_every`` becomes.
        self._cold_samples = 8 * refit_every
        self._stale = 0
        # Per step: its whole row and its seconds (the whole step's, or its parts': target, draft, rest).
        self._pending: list[tuple[np.ndarray, tuple[float, ...]]] = []
        n = len(prior)
        self._gram = np.zeros((n, n))  # forgotten sum of z z^T, z the scaled features
        self._moment = np.zeros(n)  # forgotten sum of z * duration_s
        self._num_samples = 0.0
        self._coefficients: np.ndarray | None = None
        # Counts the refits asked for: a caller that keeps what it priced with the fit knows when to price again.
        self.fit_version = 0
        # predict_many's terms that depend only on the coefficients and the batch, per batch size; cleared at each
        # solve. A policy prices every k at one batch each step, and the batch changes far less often than that.
        self._batch_terms: dict[float, tuple[float, float]] = {}
        # predict_shapes's terms per key (the fixed cost and context's coefficients, and per key and row the rest's,
        # the tokens' and the passes' seconds); cleared at each solve.
        self._context_terms = (0.0, 0.0)
        self._shape_terms: dict[Hashable, list[tuple[float, float, float]]] = {}

    def observe(self, record: StepRecord) -> float:
        """Learn from one step. Returns the seconds the model predicted for it before learning from it."""
        parts = None
        if self.features.parts and record.forward_s is not None and record.draft_s is not None:
            parts = (record.forward_s, record.draft_s)
        return self.observe_shape(
            record.num_context_tokens,
            record.num_batched_tokens,
            record.num_draft_passes,
            record.num_running,
            record.duration_s,
            parts,
        )

    def observe_shape(
        self,
        num_context_tokens: float,
        num_batched_tokens: float,
        num_draft_passes: float,
        num_running: float,
        duration_s: float,
        parts: tuple[float, float] | None = None,
    ) -> float:
        """``observe`` for a step given by its shape, for a caller that measures a feature its own way.

        ``parts``: the step's (target pass, draft passes) seconds, learned each on its own where the features have
        ``parts``; the rest of ``duration_s`` is the step's own work. Otherwise the whole step is one sample."""
        raw = np.array(self.features.row(num_context_tokens, num_batched_tokens, num_draft_passes, num_running))
        predicted_s = float(raw @ self._current())
        # The rest waits for the next solve (``_fold_pending``): a step's numpy calls, run between two forward
        # passes that have pushed them out of the CPU's caches, cost several times their warm time each.
        if parts is not None and self._part_masks is not None:
            forward_s, draft_s = parts
            self._pending.append((raw, (forward_s, draft_s, duration_s - forward_s - draft_s)))
        else:
            self._pending.append((raw, (duration_s,)))
        self._num_samples = self._decay * self._num_samples + 1.0
        self._stale += 1
        if self._stale >= self._refit_every or self._num_samples < self._cold_samples:
            self._coefficients = None
            self.fit_version += 1
        return predicted_s

    @property
    def refit_every(self) -> int:
        """Steps between two solves once the fit is warm."""
        return self._refit_every

    @refit_every.setter
    def refit_every(self, steps: int) -> None:
        """A caller that reads the fit less often for a while may let it refit less often: the steps already seen
        since the last solve count toward the new interval."""
        _check_refit_every(steps)
        self._refit_every = steps

    def observes_until_refit(self) -> int:
        """How many more steps ``observe_shape`` learns from until one asks for a refit, that one included: a caller
        may hold the steps before it and hand them over in one go, and the fit is the same as if it had seen each
        at once (it is read only at a refit)."""
        if self._num_samples * self._decay + 1.0 < self._cold_samples:
            return 1  # cold: every step refits
        return max(1, self._refit_every - (0 if self._coefficients is None else self._stale))

    def predict(
        self, num_context_tokens: float, num_batched_tokens: float, num_draft_passes: float, num_running: float
    ) -> float:
        """Predicted step seconds."""
        x = self.features.row(num_context_tokens, num_batched_tokens, num_draft_passes, num_running)
        return float(np.dot(self._current(), x))

    def predict_many(
        self,
        num_context_tokens: float | Sequence[float] | np.ndarray,
        num_batched_tokens: Sequence[float] | np.ndarray,
        num_draft_passes: Sequence[float] | np.ndarray,
        num_running: float,
    ) -> np.ndarray:
        """``predict`` for several shapes at once that share the batch (one row per k), and the context unless it is
        given per row.

        The same linear form, grouped: fixed cost and context once, the token spline per row, and one draft pass
        at this batch size times each row's passes.
        """
        phi = self._coefficients if self._coefficients is not None else self._current()
        rest_s, tokens_s, passes_s = self._context_free_terms(phi, num_batched_tokens, num_draft_passes, num_running)
        fixed_s = phi[0] + phi[1] * np.asarray(num_context_tokens, dtype=np.float64) + rest_s
        return fixed_s + tokens_s + passes_s

    def predict_shapes(
        self,
        shapes: Hashable,
        num_context_tokens: float,
        make_shapes: Callable[[], tuple[np.ndarray, np.ndarray]],
        num_running: float,
    ) -> list[float]:
        """``predict_many`` at one context, as a list, for shapes a caller prices step after step (a policy's every
        k at one batch and prefill): ``make_shapes`` gives their batched tokens and draft passes, and ``shapes``
        names them, so the same key must always come with the same shapes and ``num_running``. What does not
        depend on the context is kept under the key until the next refit, so a step whose shapes repeat costs one
        sum per row. The same floating-point operations, in the same order, as ``predict_many``: run in the engine
        between two forward passes, whose work has pushed the policy out of the CPU's caches, each numpy call cost
        several times its warm time, and a policy's pricing was most of its cost per step."""
        phi = self._coefficients if self._coefficients is not None else self._current()
        terms = self._shape_terms.get(shapes)
        if terms is None:
            tokens, passes = make_shapes()
            rest_s, tokens_s, passes_s = self._context_free_terms(phi, tokens, passes, num_running)
            rest = np.broadcast_to(rest_s, tokens_s.shape).tolist()
            terms = self._shape_terms[shapes] = list(zip(rest, tokens_s.tolist(), passes_s.tolist(), strict=True))
        context_s = self._context_terms[0] + self._context_terms[1] * float(num_context_tokens)
        return [context_s + rest + tokens + passes for rest, tokens, passes in terms]

    def _context_free_terms(
        self,
        phi: np.ndarray,
        num_batched_tokens: Sequence[float] | np.ndarray,
        num_draft_passes: Sequence[float] | np.ndarray,
        num_running: float,
    ) -> tuple[float | np.ndarray, np.ndarray, np.ndarray]:
        """``predict_many``'s terms that do not depend on the context, per row: the rest's part (0 without
        parts), the token spline's seconds and the draft passes' seconds."""
        n = np.asarray(num_batched_tokens, dtype=np.float64)
        b = float(num_running)
        per_pass_s, rest_fixed_s = self._batch_terms.get(b) or self._cache_batch_terms(phi, b)
        token_spline = phi[self._token_spline]
        tokens_s = token_spline[0] * n + np.maximum(n[:, None] - self._token_knots, 0.0) @ token_spline[1:]
        passes = np.asarray(num_draft_passes, dtype=np.float64)
        rest_s = rest_fixed_s + phi[-1] * (passes > 0) if self.features.parts else 0.0
        return rest_s, tokens_s, per_pass_s * passes

    def _cache_batch_terms(self, phi: np.ndarray, b: float) -> tuple[float, float]:
        """``predict_many``'s per-pass seconds at batch ``b`` and the rest's part without the pass indicator."""
        request_spline = phi[self._request_spline]
        per_pass_s = (
            phi[self._pass]
            + request_spline[0] * b
            + float(request_spline[1:] @ np.maximum(b - self._request_knots, 0.0))
        )
        rest_fixed_s = phi[-3] + phi[-2] * b if self.features.parts else 0.0
        terms = self._batch_terms[b] = (per_pass_s, rest_fixed_s)
        return terms

    def batched_token_seconds(self, num_batched_tokens: float) -> float:
        """What ``num_batched_tokens`` add to a step on their own: the token spline, without the fixed cost."""
        n = float(num_batched_tokens)
        spline = self._current()[self._token_spline]
        return float(spline[0] * n + np.dot(spline[1:], np.maximum(n - self._token_knots, 0.0)))

    def coefficients(self) -> dict[str, float]:
        """The clipped coefficients ``predict`` uses, by name, in seconds per unit of each feature."""
        return dict(zip(self.features.names, self._current().tolist(), strict=True))

    @property
    def num_samples(self) -> float:
        """Decayed count of observed steps: how much the fit rests on data rather than the prior."""
        return self._num_samples

    def _current(self) -> np.ndarray:
        if self._coefficients is None:
            self._coefficients = self._solve()
            self._batch_terms.clear()
            self._shape_terms.clear()
            self._context_terms = (float(self._coefficients[0]), float(self._coefficients[1]))
            self._stale = 0
        return self._coefficients

    def _fold_pending(self) -> None:
        """Decay the sums once per pending step and add the steps, the oldest decayed most; a step's rows share
        its weight."""
        m = len(self._pending)
        if not m:
            return
        if self._data_scales:
            for raw, _ in self._pending:
                self._squares = self._decay * self._squares + raw * raw
        masks = self._part_masks
        rows = [raw * masks if len(seconds) > 1 else raw[None, :] for raw, seconds in self._pending]
        x = np.concatenate(rows) / self._fold_scales
        y = np.array([s for _, seconds in self._pending for s in seconds])
        ages = np.repeat(np.arange(m - 1, -1, -1), [len(seconds) for _, seconds in self._pending])
        weighted = x * (self._decay**ages)[:, None]
        keep = self._decay**m
        self._gram = keep * self._gram + weighted.T @ x
        self._moment = keep * self._moment + weighted.T @ y
        self._pending.clear()

    def _solve(self) -> np.ndarray:
        """Ridge solution (G + w I) phi = m + w phi_prior in scaled units, unscaled, slopes made non-negative."""
        self._fold_pending()
        w = self._prior_weight
        if self._data_scales:
            scales = self._seen_scales()
            gram, moment = self._gram / np.outer(scales, scales), self._moment / scales
        else:
            scales, gram, moment = self._scales, self._gram, self._moment
        phi = np.linalg.solve(gram + self._ridge, moment + w * self._prior * scales)
        phi /= scales
        phi[:2] = np.maximum(phi[:2], 0.0)
        phi[self._pass] = max(phi[self._pass], 0.0)
        phi[self._token_spline] = _monotone_spline(phi[self._token_spline])
        phi[self._request_spline] = _monotone_spline(phi[self._request_spline])
        if self.features.parts:
            phi[-len(REST_NAMES) :] = np.maximum(phi[-len(REST_NAMES) :], 0.0)
        return phi

    def _seen_scales(self) -> np.ndarray:
        """Each feature's root mean square over the steps seen (forgotten as the fit forgets them), capped at the
        typical step's scale; that scale where a feature has been zero, where any positive scale leaves its
        coefficient at the prior."""
        rms = np.sqrt(self._squares / max(self._num_samples, 1e-12))
        return np.where(rms > 0.0, np.minimum(rms, self._scales), self._scales)


def _check_refit_every(steps: int) -> None:
    if steps < 1:
        raise ValueError(f"refit_every={steps} must be at least 1")


def _monotone_spline(coefficients: np.ndarray) -> np.ndarray:
    """Slope then increments, adjusted so every segment's slope is non-negative."""
    slopes = np.maximum(np.cumsum(coefficients), 0.0)
    increments = slopes.copy()
    increments[1:] -= slopes[:-1]
    return increments
