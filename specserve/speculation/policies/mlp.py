"""SpecKV (arXiv 2605.02888): k from a small MLP that predicts acceptance from the draft's own uncertainty.

SpecKV §4.3, Eq. 1: with a-hat = clip(MLP(draft signals, compression, gamma), 0, 1),

    tokens objective (the paper):   argmax_gamma  a-hat * gamma + 1                 (tokens per step)
    cost objective (our default):   argmax_gamma  B * (a-hat * gamma + 1) / T(gamma)  (tokens per second)

over the candidate set {2, 4, 6, 8}, ties to the smaller gamma. The paper's objective ignores that a longer
draft costs more, though its own measurements show it (§5.2, Table 1: under FP16 most tasks run fastest at
gamma 2 or 4; in the authors' released timings gamma 8 has ~13% less throughput than gamma 4), so ``cost``
divides by the step time of TurboSpec's online latency model (``StepLatencyModel``).

Choices the paper leaves open (it evaluates offline, at batch size 1):
- Features are lagged: those of the last observed speculative step (the paper computes a step's features
  from the drafts of that same step, known only after it chose gamma), computed per
  request over its drafted tokens and averaged over the step's requests (one prediction per candidate
  instead of one per request; the batch shares one k). Per-request gamma is not produced.
- Until a step with draft signals has been observed the policy behaves exactly like ``goodput:max_k=4``,
  which it feeds every record. The vLLM engine reports both signals from the draft's logits
  (``replicas/worker/draft_signals.py``). If the candidates include 0 and the policy picks it, the features go stale
  until the latency fit or the batch moves the choice.
- The cost objective's T(gamma) leaves out the step's prefill chunk, as ``goodput`` does (its module docstring):
  the chunk runs whatever gamma is, and charged to T it makes long drafts look like they amortise it.

What the engine must provide: per drafted token the draft's probability of the drafted token and the
draft distribution's entropy (``StepRecord.draft_confidence_per_request``, ``draft_entropy_per_request``,
nats); per-request gamma needs per-request draft lengths. The default weights are synthetic
(the lab's ``lab/speckv/synthetic.py``) until retrained on real step logs with ``python -m lab train-mlp``; the
``weights`` parameter names the file.
"""

from __future__ import annotations

from dataclasses import dataclass

from specserve.speculation.estimators.step_latency import StepLatencyModel
from specserve.speculation.policies.goodput import GoodputParams, GoodputPolicy
from specserve.speculation.policies.parts.ties import argmax_smallest
from specserve.speculation.policy import Policy, register
from specserve.speculation.speckv.model import (
    COMPRESSION_CODES,
    MlpWeights,
    load_weights,
    predict_acceptance,
    step_features,
)
from specserve.speculation.types import Decision, EngineTraits, StepContext, StepRecord

OBJECTIVES = ("cost", "tokens")


def parse_gammas(text: str) -> tuple[int, ...]:
    """Candidates joined by '-' (',' ends a spec parameter), e.g. "2-4-6-8"; sorted, without repeats."""
    try:
        values = sorted({int(part) for part in text.split("-")})
    except ValueError:
        raise ValueError(f"gammas={text!r} must be non-negative integers joined by '-'") from None
    if not values or values[0] < 0:
        raise ValueError(f"gammas={text!r} must be non-negative integers joined by '-'")
    return tuple(values)


@dataclass(frozen=True, slots=True)
class MlpParams:
    # Candidate gammas, "-"-joined: the paper's {2, 4, 6, 8} (§4.1, Eq. 1); capped by the engine's max_k.
    gammas: str = "2-4-6-8"
    # "cost": tokens per second with the latency model (our extension); "tokens": Eq. 1 as published.
    objective: str = "cost"
    # The target's weight quantization, fp16 / int8 / nf4: the compression feature (SpecKV §4.1).
    compression: str = "fp16"
    # Path of a weights JSON from ``python -m lab train-mlp``; empty means the packaged synthetic defaults.
    weights: str = ""
    # Latency fit half-life in steps, as in ``goodput``.
    latency_half_life_steps: float = 1000.0

    def __post_init__(self) -> None:
        parse_gammas(self.gammas)
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective={self.objective!r} must be one of {', '.join(OBJECTIVES)}")
        if self.compression not in COMPRESSION_CODES:
            raise ValueError(f"compression={self.compression!r} must be one of {', '.join(COMPRESSION_CODES)}")
        if not self.latency_half_life_steps > 0:
            raise ValueError(f"latency_half_life_steps={self.latency_half_life_steps} must be positive")


@register
class MlpPolicy(Policy):
    """Argmax over candidate gammas of MLP-predicted tokens per second (or per step); goodput without signals."""

    name = "mlp"
    Params = MlpParams

    def __init__(
        self,
        params: MlpParams,
        traits: EngineTraits,
        latency: StepLatencyModel | None = None,
        weights: MlpWeights | None = None,
    ) -> None:
        super().__init__(params, traits)
        # Candidates past the engine's max_k shrink to it; duplicates collapse.
        self.gammas = tuple(sorted({min(g, traits.max_k) for g in parse_gammas(params.gammas)}))
        self.weights = weights if weights is not None else load_weights(params.weights)
        if latency is None:
            latency = StepLatencyModel(half_life_steps=params.latency_half_life_steps)
        self.latency = latency
        # 0..4: goodput's cap before it followed the engine's max_k, which SpecKV's runs (max_k 10) were made with.
        self.fallback = GoodputPolicy(GoodputParams(max_k=4), traits, latency=self.latency)
        self._compression = float(COMPRESSION_CODES[params.compression])
        # Mean over the last speculative step's requests of (mean H, mean c, max H, min c); None before any.
        self.features: tuple[float, float, float, float] | None = None
        self._last_scores: list[float] = []

    def choose(self, ctx: StepContext) -> Decision:
        if self.features is None:
            return self.fallback.choose(ctx)
        if not ctx.draft_resident or ctx.num_running == 0:
            return Decision(k=0)
        self._last_scores = [self.score(ctx, gamma) for gamma in self.gammas]
        return Decision(k=self.gammas[argmax_smallest(self._last_scores)])

    def observe(self, record: StepRecord) -> None:
        # The fallback shares the latency model, so its observe also fits it: one fit, fed once.
        self.fallback.observe(record)
        per_request = [
            step_features(confidences, entropies)
            for confidences, entropies in zip(
                record.draft_confidence_per_request, record.draft_entropy_per_request, strict=True
            )
            if confidences and len(confidences) == len(entropies)
        ]
        if per_request:
            n = len(per_request)
            mean_h, mean_c, max_h, min_c = (sum(f[i] for f in per_request) / n for i in range(4))
            self.features = (mean_h, mean_c, max_h, min_c)

    def predicted_acceptance(self, gamma: int) -> float:
        """a-hat for ``gamma`` from the current (lagged) features; 0 before any features."""
        if self.features is None:
            return 0.0
        return predict_acceptance(self.weights, (*self.features, self._compression, float(gamma)))

    def score(self, ctx: StepContext, gamma: int) -> float:
        """The objective for one candidate: tokens per step, or batch tokens per second."""
        tokens = self.predicted_acceptance(gamma) * gamma + 1.0 if gamma > 0 else 1.0
        if self.params.objective == "tokens":
            return tokens
        step_s = self.latency.predict(
            num_context_tokens=ctx.num_context_tokens,
            num_batched_tokens=ctx.num_running * (gamma + 1),  # no prefill chunk (module docstring)
            num_draft_passes=gamma if gamma > 0 else int(self.traits.k0_runs_draft_pass),
            num_running=ctx.num_running,
        )
        return ctx.num_running * tokens / max(step_s, 1e-9)

    def describe(self) -> dict[str, float]:
        out: dict[str, float] = {"signals_seen": float(self.features is not None)}
        if self.features is not None:
            out.update({f"predicted_acceptance_k{g}": self.predicted_acceptance(g) for g in self.gammas})
        if self._last_scores:  # empty until a step is scored from features
            out.update({f"score_k{g}": s for g, s in zip(self.gammas, self._last_scores, strict=True)})
        return out
