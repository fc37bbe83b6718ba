"""AdaSpec (SoCC '25, arXiv 2503.05096): throughput under a TPOT SLO, confidence-driven drafting and trimming.

The estimator is in ``estimators.slo_efficiency``, the searches in ``parts.slo_search``. Per step:

1. **Batch k** (§5.1, Algorithm 1's predict step): f(k) = N(k) / T(k) with every draft predicted at the
   historical mean confidence c-bar (Eq. 7: P_j = c-bar^j), searched k = 0, 1, ... up to the first peak
   (Theorem 4.3), k > 0 only if f(1) > f(0). With ``ctx.slo_tpot_s`` set, any k > 0 whose predicted step
   time exceeds it scores -1 (§5.3), so the search never passes a k that breaks the SLO; with None this
   is plain goodput under the confidence acceptance model.
2. **Per-request trimming** (§5.2, Algorithm 2): each request's drafts are predicted at its own mean past
   confidence; the least likely draft is dropped while that raises f. Caps below k go out as
   ``Decision.max_k_per_request``; if every request was trimmed, k itself drops to the longest kept draft.
3. **Early stop** (§5.1, the execute-correct half): where the engine asks (``EngineTraits.asks_stop_drafting``),
   the decision's ``draft_stop`` replaces the prediction with each pass's real batch-mean confidence and stops
   at the first drop in f, or when the next pass is predicted not to pay. Only the simulator asks; the vLLM
   engine reports the confidences (c-bar and trimming work there) but drafts a step before it verifies, so there
   the policy is steps 1-2.

Differences from the paper, each forced by where the decision is taken:
- The latency model is TurboSpec's online fit (``StepLatencyModel``, ``LINEAR``) instead of an offline-profiled
  table; a profiled prior can be injected. It has no CUDA-graph padding, so trimming pays less often than in
  the paper, whose released verifier trims at padding-bucket granularity: its gain comes mostly from dropping
  a step to a smaller padded batch.
- Trimming happens before drafting, from each request's past confidences (lagged), not from the drafts
  just made. The draft loop re-estimates f for the whole batch with batch-mean confidences.
- c-bar is the running mean of all raw confidences since start (the authors' code) but skips the pass
  at which the draft loop saw f drop, as the code does.
- On an engine that verifies by batch expansion (``EngineTraits.batch_expansion``, AdaSpec's vLLM 0.6.3 fork),
  the fit's context feature is Eq. 4's ``(k + 1) * C + b * k (k + 1) / 2``, C the cached context, k the mean
  drafts per speculating request of an observed step; on a single-pass verifier it is C, as in TurboSpec Eq. 3.
- T(k) leaves out the step's prefill chunk, as ``goodput`` does. AdaSpec extends vLLM's speculative decoding
  (§6; the authors' release forks vLLM 0.6.3), which runs with chunked prefill off, so its speculative steps are
  decode-only and T is decode time. Under chunked prefill a chunk rides along whatever k is; charged to T it acts
  as a fixed cost that longer drafts seem to amortise, and on a saturated 7B/4090 run
  (bench/scenarios/nightjar-4090-7b-sharegpt-30qps.yaml) the first peak ran to k = 4 with 15% less throughput
  than k = 0. The SLO guard therefore also checks the decode part of the step: the chunk's time is not something
  k can give back.

What the engine must provide: per drafted token the draft's probability of the drafted token
(``StepRecord.draft_confidence_per_request`` with ``request_ids``), ``StepContext.request_ids`` for trimming,
the SLO in ``StepContext.slo_tpot_s``, and per-request draft lengths to honour the caps. Without
confidences c-bar stays at its 0.6 prior; without request ids nothing is trimmed.
"""

from __future__ import annotations

from dataclasses import dataclass

from specserve.speculation.estimators.slo_efficiency import (
    SLO_VIOLATION,
    StepSeconds,
    batch_expansion_context,
    uniform_efficiencies,
)
from specserve.speculation.estimators.step_latency import StepLatencyModel
from specserve.speculation.policies.parts.slo_search import SloDraftStop, eliminate_drafts, first_peak
from specserve.speculation.policy import Policy, largest_k, register
from specserve.speculation.types import Decision, EngineTraits, StepContext, StepRecord


@dataclass(frozen=True, slots=True)
class SloParams:
    # K_max, the most draft passes per step: 8 in every AdaSpec run (§7.4, Fig. 13: "preset maximum value of 8");
    # capped by the engine's max_k (None: the engine's).
    max_k: int | None = 8
    # c-bar before any confidence is seen: default_confidence in the authors' released code.
    default_confidence: float = 0.6
    # Run the confidence prior verifier (§5.2): true is AdaSpec, false is the AdaSpec- ablation (§7.3, Table 2).
    trim: bool = True
    # Latency fit half-life in steps, as in ``goodput`` (the paper profiles offline and never refits).
    latency_half_life_steps: float = 1000.0
    # The SLO guard of §5.3 (a speculative step predicted longer than the TPOT SLO scores -1). The paper describes
    # it; the authors' released code has it commented out: false runs that code.
    guard: bool = True

    def __post_init__(self) -> None:
        if self.max_k is not None and self.max_k < 0:
            raise ValueError(f"max_k={self.max_k} must be non-negative")
        if not 0.0 <= self.default_confidence <= 1.0:
            raise ValueError(f"default_confidence={self.default_confidence} must lie in [0, 1]")
        if not self.latency_half_life_steps > 0:
            raise ValueError(f"latency_half_life_steps={self.latency_half_life_steps} must be positive")


@register
class SloPolicy(Policy):
    """AdaSpec: first-peak k under the TPOT SLO, per-request trimming, confidence-corrected early stop."""

    name = "slo"
    Params = SloParams

    def __init__(self, params: SloParams, traits: EngineTraits, latency: StepLatencyModel | None = None) -> None:
        super().__init__(params, traits)
        # Largest k searched: the engine's buffers cap what the user asked for.
        self.max_k = largest_k(params.max_k, traits)
        if latency is None:
            latency = StepLatencyModel(half_life_steps=params.latency_half_life_steps)
        self.latency = latency
        self._confidence_sum, self._confidence_count = 0.0, 0
        # request id -> (sum, count) of its raw draft confidences: its own c for trimming.
        self._request_confidence: dict[str, tuple[float, int]] = {}
        # The draft-loop rule of the last decision: observe() reads which pass, if any, it saw f drop at.
        self._draft_stop: SloDraftStop | None = None
        self.num_slo_bound = 0  # steps whose k the SLO guard capped
        self.num_trimmed_drafts = 0
        self._last_efficiency = 0.0

    @property
    def mean_confidence(self) -> float:
        """c-bar: the mean of all raw draft confidences seen, or the default before any."""
        if self._confidence_count == 0:
            return self.params.default_confidence
        return self._confidence_sum / self._confidence_count

    def choose(self, ctx: StepContext) -> Decision:
        self._draft_stop = None
        self._forget_finished(ctx.request_ids)
        if not ctx.draft_resident or ctx.num_running == 0:
            return Decision(k=0)
        step_seconds = self._step_seconds(ctx)
        slo_tpot_s = ctx.slo_tpot_s if self.params.guard else None
        efficiencies = uniform_efficiencies(ctx.num_running, self.mean_confidence, self.max_k, step_seconds, slo_tpot_s)
        k = first_peak(efficiencies)
        if k < self.max_k and efficiencies[k + 1] == SLO_VIOLATION:
            self.num_slo_bound += 1
        self._last_efficiency = efficiencies[k]
        caps: tuple[tuple[str, int], ...] = ()
        if k > 0 and self.params.trim and len(ctx.request_ids) == ctx.num_running:
            confidences = [self._confidence_of(rid) for rid in ctx.request_ids]
            lengths, _ = eliminate_drafts(confidences, k, step_seconds)
            self.num_trimmed_drafts += k * len(lengths) - sum(lengths)
            k = max(lengths)
            caps = tuple((rid, n) for rid, n in zip(ctx.request_ids, lengths, strict=True) if n < k)
        if k > 0 and self.traits.asks_stop_drafting:
            self._draft_stop = SloDraftStop(
                ctx.num_running,
                k,
                step_seconds,
                slo_tpot_s,
                self.mean_confidence,
                best=efficiencies[0],
                emitted=ctx.num_running,
            )
        return Decision(k=k, max_k_per_request=caps, draft_stop=self._draft_stop)

    def observe(self, record: StepRecord) -> None:
        context: float = record.num_context_tokens
        if self.traits.batch_expansion and record.num_drafted_per_request:
            mean_k = record.num_drafted / len(record.num_drafted_per_request)
            context = batch_expansion_context(context, len(record.num_drafted_per_request), mean_k)
        self.latency.observe_shape(
            context, record.num_batched_tokens, record.num_draft_passes, record.num_running, record.duration_s
        )
        dropped = self._draft_stop.dropped_position if self._draft_stop is not None else None
        for i, values in enumerate(record.draft_confidence_per_request):
            kept = values if dropped is None else values[:dropped]
            self._confidence_sum += sum(kept)
            self._confidence_count += len(kept)
            if i < len(record.request_ids) and values:
                total, count = self._request_confidence.get(record.request_ids[i], (0.0, 0))
                self._request_confidence[record.request_ids[i]] = (total + sum(values), count + len(values))
        self._draft_stop = None

    def describe(self) -> dict[str, float]:
        out = {f"latency_{name}": value for name, value in self.latency.coefficients().items()}
        out["mean_confidence"] = self.mean_confidence
        out["predicted_efficiency_tokens_per_s"] = self._last_efficiency
        out["num_slo_bound_steps"] = float(self.num_slo_bound)
        out["num_trimmed_drafts"] = float(self.num_trimmed_drafts)
        return out

    def _confidence_of(self, request_id: str) -> float:
        total, count = self._request_confidence.get(request_id, (0.0, 0))
        return total / count if count else self.mean_confidence

    def _forget_finished(self, request_ids: tuple[str, ...]) -> None:
        if request_ids and len(self._request_confidence) > len(request_ids):
            running = set(request_ids)
            self._request_confidence = {r: v for r, v in self._request_confidence.items() if r in running}

    def _step_seconds(self, ctx: StepContext) -> StepSeconds:
        k0_passes = int(self.traits.k0_runs_draft_pass)
        expansion = self.traits.batch_expansion

        def step_seconds(num_draft_passes: int, num_verified: int) -> float:
            context: float = ctx.num_context_tokens
            if expansion:  # the target reads what batch expansion scores (module docstring)
                context = batch_expansion_context(context, ctx.num_running, num_draft_passes)
            return self.latency.predict(
                num_context_tokens=context,
                num_batched_tokens=num_verified,  # no prefill chunk: it runs whatever k is (module docstring)
                num_draft_passes=num_draft_passes if num_draft_passes > 0 else k0_passes,
                num_running=ctx.num_running,
            )

        return step_seconds
