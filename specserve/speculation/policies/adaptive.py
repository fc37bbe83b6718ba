"""``adaptive``: the project's own policy, TurboSpec's goodput argmax with four changes.

1. **A step cost that bends** (hinge_latency.py). The batched-token cost is a linear spline, so the policy
   sees that drafts are nearly free below the GPU's ridge point and cost their FLOPs above it. TurboSpec's
   straight line (goodput.py) overprices k at small batches and underprices it at large ones.
2. **Prefill priced at the margin.** A chunked-prefill step carries P prompt tokens whatever k is. Charging
   the whole step to the decodes makes speculation look like it amortises a fixed cost (goodput.py's
   docstring: a runaway to k_max under overload); ignoring P (goodput) misses that P pushes the step past the
   ridge point, where every draft token costs compute. We charge the decodes the step's time minus what
   the prefill would take on its own, beyond the fixed per-step cost:
   ``D(k) = T(P + B(k + 1), passes(k)) - (T(P, 0) - T(0, 0))``, and maximise ``B * l(k) / D(k)``.
3. **A correction per batch bucket and k** (bucket_correction.py): the fit's out-of-sample residual averaged
   per power-of-two batch bucket and k, Nightjar-style (research/nightjar.md §2.5), so a bias the global fit
   cannot shed (the ridge point moves with the context) does not decide k.
4. **Hysteresis.** A new k must beat the current one by ``switch_margin``; every switch re-sizes the
   draft's batch and, in vLLM, cuts drafts already proposed. Exploration of neighbouring k (needed by any
   online fit, probe.NeighbourExplorer) runs every ``explore_interval_s``, less often than goodput's, and
   backs off (doubling, up to ``explore_backoff_max`` x) while the explorations leave k where it is.
5. **Confidence-driven draft length** (early_stop.py), where the engine asks after each draft pass
   (``EngineTraits.asks_stop_drafting``; the simulator, not vLLM yet): the step is granted up to
   ``early_stop_extra`` drafts beyond k, and the loop stops once the drafts' confidences say further passes
   lower the same objective. AdaSpec's execute-correct loop (research/adaspec.md §5.1) stops early only;
   letting sure drafts run on is where a batch of one gains most.

No separate SLO guard: for a fixed batch, maximising B * l(k) / D(k) is minimising the decodes' TPOT
D(k) / l(k), which is what AdaSpec's SLO-constrained goodput (research/adaspec.md §3) protects.
Cold start and k = 0 behave as in goodput: a prior acceptance of 0.5, a periodic probe while k is 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specserve.speculation.estimators.acceptance import PositionAcceptance
from specserve.speculation.estimators.bucket_correction import BucketCorrection
from specserve.speculation.policies.parts.early_stop import ConfidenceStop
from specserve.speculation.policies.goodput import describe_estimates
from specserve.speculation.estimators.step_latency import HINGED, StepLatencyModel
from specserve.speculation.policy import Policy, register
from specserve.speculation.policies.parts.probe import NeighbourExplorer, ZeroProbe
from specserve.speculation.policies.parts.ties import argmax_smallest
from specserve.speculation.types import Decision, EngineTraits, StepContext, StepRecord


@dataclass(frozen=True, slots=True)
class AdaptiveParams:
    # Largest k searched (capped by the engine's max_k). Deep positions are learned from exploration steps.
    k_max: int = 8
    ema_half_life_steps: float = 20.0
    prior_alpha: float = 0.5
    probe_interval_s: float = 2.0
    probe_k: int = 1
    latency_half_life_steps: float = 1000.0
    # Relative gain over k = 0 needed to speculate at all (goodput.py: vLLM's k = 0 still runs a draft pass).
    min_gain: float = 0.02
    # Relative gain over the current k needed to move to another k > 0.
    switch_margin: float = 0.03
    explore_interval_s: float = 2.0
    # Each exploration after which k still holds doubles the interval, up to this many times the base: a k
    # that keeps winning needs less checking (Nightjar's exploration decays too, research/nightjar.md §2.5).
    explore_backoff_max: float = 8.0
    # Samples each (batch bucket, k) residual average remembers (bucket_correction.py).
    correction_memory: float = 20.0
    # Let draft confidences end the draft loop where the engine asks (module docstring, 5); false prices k as on an
    # engine that cannot stop early (vLLM today), for comparing like with like.
    confidence_stop: bool = True
    # Drafts granted beyond k when confidences may stop the loop.
    early_stop_extra: int = 2

    def __post_init__(self) -> None:
        checks = {
            "k_max": self.k_max >= 0,
            "ema_half_life_steps": self.ema_half_life_steps > 0,
            "prior_alpha": 0.0 <= self.prior_alpha <= 1.0,
            "probe_interval_s": self.probe_interval_s > 0,
            "probe_k": self.probe_k >= 1,
            "latency_half_life_steps": self.latency_half_life_steps > 0,
            "min_gain": 0.0 <= self.min_gain < 1.0,
            "switch_margin": 0.0 <= self.switch_margin < 1.0,
            "explore_interval_s": self.explore_interval_s > 0,
            "correction_memory": self.correction_memory >= 1.0,
            "explore_backoff_max": self.explore_backoff_max >= 1.0,
            "early_stop_extra": self.early_stop_extra >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)} is out of range")


@register
class AdaptivePolicy(Policy):
    """Argmax of marginal goodput under a piecewise-linear step cost, with hysteresis."""

    name = "adaptive"
    Params = AdaptiveParams

    def __init__(self, params: AdaptiveParams, traits: EngineTraits) -> None:
        super().__init__(params, traits)
        self.limit_k = min(params.k_max, traits.max_k)
        self.acceptance = PositionAcceptance(
            max_k=max(1, self.limit_k), half_life_steps=params.ema_half_life_steps, prior_alpha=params.prior_alpha
        )
        self.latency = StepLatencyModel(HINGED, half_life_steps=params.latency_half_life_steps, refit_every=8)
        self.correction = BucketCorrection(params.correction_memory)
        self.probe = ZeroProbe(params.probe_interval_s)
        self.explorer = NeighbourExplorer(params.explore_interval_s)
        # The k the policy itself chose last (exploration and probe steps aside).
        self._k = 0
        self._explorations_seen = 0
        self._last_goodput_tokens_per_s = 0.0
        self._draft_loop: ConfidenceStop | None = None
        self.num_early_stops = 0

    def choose(self, ctx: StepContext) -> Decision:
        self._draft_loop = None
        if not ctx.draft_resident:
            return Decision(k=0)
        if ctx.num_running == 0:
            # Nothing decodes, so k changes nothing this step; keeping it avoids two switches per idle gap.
            return Decision(k=self._k)
        seconds = np.maximum(self.decode_seconds_all(ctx), 1e-9).tolist()
        tokens = self.acceptance.expected_tokens_upto(self.limit_k)
        goodputs = [ctx.num_running * n / s for n, s in zip(tokens, seconds)]
        k = argmax_smallest(goodputs)
        if k > 0 and goodputs[k] < goodputs[0] * (1.0 + self.params.min_gain):
            k = 0
        current = min(self._k, self.limit_k)
        if k > 0 and current > 0 and goodputs[k] < goodputs[current] * (1.0 + self.params.switch_margin):
            k = current
        self._back_off_exploration(k)
        self._k = k
        self._last_goodput_tokens_per_s = goodputs[k]
        if k > 0:
            self.probe.speculating()
            k = self.explorer.neighbour(ctx.now_s, k, self.limit_k)
            if self.params.confidence_stop and self.traits.asks_stop_drafting and k > 0:  # explored 0 stays 0
                k = min(k + self.params.early_stop_extra, self.limit_k)
                self._draft_loop = ConfidenceStop(ctx.num_running, seconds, self.acceptance.alphas(), k)
        else:
            self.explorer.stopped()
            if self.limit_k > 0 and self.probe.should_probe(ctx.now_s):
                k = min(self.params.probe_k, self.limit_k)
        return Decision(k=k)

    def stop_drafting(self, position: int, confidence: float) -> bool:
        if self._draft_loop is None:
            return False
        stop = self._draft_loop.after_pass(position, confidence)
        if stop and position + 1 < self._draft_loop.max_passes:
            self.num_early_stops += 1
        return stop

    def _back_off_exploration(self, k: int) -> None:
        base = self.params.explore_interval_s
        if k != self._k:
            self.explorer.interval_s = base
        elif self.explorer.num_explorations > self._explorations_seen:
            self.explorer.interval_s = min(2.0 * self.explorer.interval_s, base * self.params.explore_backoff_max)
        self._explorations_seen = self.explorer.num_explorations

    def observe(self, record: StepRecord) -> None:
        # The residual is taken before the fit sees the step: out of sample, like the predictions it corrects.
        predicted_s = self.latency.observe(record)
        # Keyed by the drafts the step ran, which an early stop makes fewer than its k.
        k_run = max(record.num_drafted_per_request, default=0) or record.k
        self.correction.observe(record.num_running, k_run, record.duration_s - predicted_s)
        if record.num_drafted > 0:
            self.acceptance.observe(record)
            self.probe.verdict()

    def decode_seconds_all(self, ctx: StepContext) -> np.ndarray:
        """Per k = 0 .. limit_k, the step's time the decodes are charged with: all of it minus the prefill's own
        marginal cost."""
        batch, prefill = ctx.num_running, ctx.num_prefill_tokens
        ks = np.arange(self.limit_k + 1)
        passes = np.where(ks > 0, ks, int(self.traits.k0_runs_draft_pass))
        step_s = self.latency.predict_many(ctx.num_context_tokens, prefill + batch * (ks + 1), passes, batch)
        prefill_s = self.latency.batched_token_seconds(prefill) if prefill else 0.0
        return step_s - prefill_s + np.array(self.correction.corrections_s(batch, self.limit_k + 1))

    def decode_seconds(self, ctx: StepContext, k: int) -> float:
        return float(self.decode_seconds_all(ctx)[k])

    def describe(self) -> dict[str, float]:
        out = describe_estimates(self)
        out["num_early_stops"] = float(self.num_early_stops)
        return out
