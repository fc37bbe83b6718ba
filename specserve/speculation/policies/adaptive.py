"""``adaptive``: the project's own policy, TurboSpec's goodput argmax with seven changes.

1. **A step cost that bends** (``StepLatencyModel`` with ``HINGED`` features). The batched-token cost is a
   linear spline, so the policy sees that drafts are nearly free below the GPU's ridge point and cost their
   FLOPs above it. TurboSpec's straight line (goodput.py) overprices k at small batches and underprices it at
   large ones. Where the engine times a step's parts (the target's pass, the draft's passes), the fit learns each
   on its own (``StepFeatures.parts``): held at one k, a whole step cannot say which of its costs grow with k.
   Where the target verifies by batch expansion (``EngineTraits.batch_expansion``) its pass reads each request's
   context once per scored position, so the fit's context is those reads (AdaSpec's Eq. 4, as ``slo`` counts
   them); learned as one k's plain context, the target's part priced every other k's reads as that k's, and on
   AdaSpec's trace at 3.3-3.5 QPS the simulator's mean E2E rose 4 % over the best rival's.
2. **Prefill priced at the margin.** A chunked-prefill step carries P prompt tokens whatever k is. Charging
   the whole step to the decodes makes speculation look like it amortises a fixed cost (goodput.py's
   docstring: a runaway to max_k under overload); ignoring P (goodput) misses that P pushes the step past the
   ridge point, where every draft token costs compute. We charge the decodes the step's time minus what
   the prefill would take on its own, beyond the fixed per-step cost:
   ``D(k) = T(P + B(k + 1), passes(k)) - (T(P, 0) - T(0, 0))``, and maximise ``B * l(k) / D(k)``.
   Where drafts are made a step ahead of their verification (vLLM), a step's prefill does not stop speculation by
   itself (``hold_stops_on_prefill``): a stop on a step that carries prompt tokens must also win on the decodes alone.
   There a step at k = 0 throws away the drafts made for it and makes none for the next, which then verifies
   nothing whatever its k, so a stop lasts two steps however briefly the prices favour it. Served at 48 clients on
   a CPU, where the fit priced the decodes riding on a prompt at less than half their price alone, k went to 0 on
   the steps that carried the replacing requests' prompts and back to 2 on the next, every 1-3 steps for 20 s: a
   third of its k = 2 steps verified no drafts, and it served 0.79-0.85 x `fixed:k=1`.
   Moves between two k > 0 throw nothing away, so they stand: holding every change of k (the rule's first form)
   also kept k = 2 at 8 clients on perf pair S, where k = 3 was best and the prompt-carrying steps' prices said so
   (replayed on one run's steps: 186 steps at k = 3 with stops held alone, 137 with every change held).
3. **A correction per batch bucket and k** (``estimators.bucket_correction``): the fit's out-of-sample miss,
   as a ratio per power-of-two batch bucket, as Nightjar keeps its statistics per batch size (§5.2), so a
   bias the global fit cannot shed (the ridge point moves with the context) does not decide k. It is split
   into a level common to every k, which follows the machine's phases, and per k an offset from it, so a
   k measured in a slow minute is not priced by that minute afterwards. Outliers are
   bounded and thinly measured cells shrunk toward their bucket: on a served CPU engine, stalls otherwise
   priced a rarely run k far off. The fit's first ``CORRECTION_AFTER_STEPS`` steps teach it nothing: their
   miss is the cold prior's. On a served CPU engine the first step (a 32-token prefill at k = 0, 1.33 s where
   the prior said a few ms) put k = 0's factor at batch 1 at 1.33-1.42 against k = 2's 0.93-0.97. k = 0 never
   ran again at one request, so nothing brought it down: k = 0 was priced at about 125 ms where it measured
   68, and half the one-request steps ran k = 2 (8.8 tok/s, against 14.1 at k = 1).
   (Projecting the corrected costs onto a sequence non-decreasing in k was tried
   and dropped: pooling a violating pair prices both alike, which hands the tie to the deeper k; on DSDE's
   offline batches it raised mean k from 5.2 to 6.0 and mean E2E by 4-6 %.)
4. **Hysteresis.** A new k must beat the current one by ``switch_margin``, and so must k = 0 when the policy
   speculates: every switch re-sizes the draft's batch and, in vLLM, cuts drafts already proposed, and a stop
   is followed by a resume's catch-up. Leaving k = 0 has its own bar (``min_gain`` and the resume's payback,
   5); while stopping had none, the two were one threshold, and predictions straddling it moved a served CPU
   engine at 16 clients across k = 0 nine times per 100 steps (replayed from its step log; three with this
   rule). Exploration of neighbouring k (needed by any
   online fit, ``parts.probe.NeighbourExplorer``) runs every ``explore_interval_s``, less often than goodput's, and
   backs off (doubling, up to ``explore_backoff_max`` x) while the explorations leave k where it is; with
   ``explore_zero_every`` every n-th step down goes to k = 0, which a policy settled at k >= 2 otherwise never
   measures (its cost is then the fit's extrapolation to zero draft passes). Where drafts
   are made a step ahead of their verification (vLLM), a step up lasts two steps: the first verifies only the k
   drafts made before it.
5. **Resuming priced** where k = 0 skips the draft pass (``EngineTraits.resume_s_per_token``): leaving k = 0
   costs one catch-up of the draft over the tokens it skipped (``parts.switching.DraftLag``), so the policy
   resumes only if the predicted gain over k = 0 repays that within ``resume_payback_s``. Nightjar prices the
   same switch per token in its Eq. 4; a payback time keeps it in the goodput objective's units.
6. **Confidence-driven draft length** (``parts.early_stop``), where the engine asks after each draft pass
   (``EngineTraits.asks_stop_drafting``; the simulator): the step is granted up to ``early_stop_extra`` drafts
   beyond k, and its ``Decision.draft_stop`` ends the loop once the drafts' confidences say further passes lower
   the same objective. AdaSpec's execute-correct loop (§5.1) stops early only; letting sure drafts run on is
   where a batch of one gains most. vLLM drafts a step ahead of verifying (``verifies_confident_prefix``): there
   the same rule, priced with the step's k passes whatever it verifies, can cut the drafts before verification
   to their confident prefix (SpecDec++'s threshold, here the objective's own), but only when asked
   (``verify_confident_prefix``): k is chosen as if every draft were verified, so a rule that then cuts them
   pays for passes whose drafts it throws away. On a served CPU engine in a burst, k = 3 steps at 8-16 requests
   verified 1.01 drafts per request: three passes for one draft, 25 % slower steps than k = 1 for the same
   tokens. A confidence is read as the
   acceptance drafts of that confidence have had (``estimators.confidence_calibration``), not as AdaSpec's Eq. 7
   takes it: real drafts are rarely calibrated (the tiny trained draft's 0.05 was accepted 65 % of the time).

7. **No k that preempts** (``parts.kv_fit``). When the KV pool is nearly full, the k it runs is cut to the largest
   whose new KV blocks fit the free ones (the engine counts them per k, ``StepContext.kv_blocks_needed``): a
   preempted request recomputes its whole context, which no draft's gain repays. The goodput argmax prices a
   step's time and tokens, not the pool. The oracle (specserve/sim/oracle.py) rules out such k too. In three of the
   simulator's saturated cells (6 seeds) the cut took 56-65 % of the preemptions and 4-17 % of the mean E2E off.

No separate SLO guard: for a fixed batch, maximising B * l(k) / D(k) is minimising the decodes' TPOT
D(k) / l(k), which is what AdaSpec's SLO-aware efficiency (§5.3) protects.
Cold start and k = 0 behave as in goodput (the shared ``parts.goodput_core``): a prior acceptance of 0.5, a
periodic probe while k is 0. With ``probe_backoff_max`` > 1 the probe interval backs off as the explorations do
(doubling while the probes leave k at 0, back to ``probe_interval_s`` once the policy speculates): where k = 0 is
best for good, a probe every 2 s pays a draft pass and, where k = 0 skips the draft, a catch-up over every token
it skipped. Off by default: on the simulator's overload tuning scenario the probes are how the policy learns
that k = 1 pays again, and 8 x the interval cost 2 % of the mean E2E (4 x: nothing). With ``probe_on_turnover``
(on by default) a probe also starts once every request the acceptance estimate last learned from has left the
batch, and the estimate forgets their evidence down to the prior's weight: at one request a time, one request with
a poor draft otherwise holds its successors at k = 0, each clock probe's single verdict moving the estimate by 3 %.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from specserve.speculation.estimators.bucket_correction import BucketCorrection
from specserve.speculation.estimators.confidence_calibration import ConfidenceCalibration
from specserve.speculation.estimators.slo_efficiency import batch_expansion_context
from specserve.speculation.estimators.step_latency import HINGED, StepLatencyModel
from specserve.speculation.policies.parts.early_stop import ConfidenceStop, StopCounter
from specserve.speculation.policies.parts.goodput_core import MIN_STEP_S, GoodputCore
from specserve.speculation.policies.parts.kv_fit import largest_fitting_k
from specserve.speculation.policies.parts.probe import up_steps_for
from specserve.speculation.policies.parts.switching import DraftLag, measured_resume_s
from specserve.speculation.policy import Policy, largest_k, register
from specserve.speculation.types import Decision, EngineTraits, StepContext, StepRecord

# Steps at each of two draft-pass counts or more that a warm-start history needs to teach step costs.
WARM_MIN_STEPS_PER_K = 16
# Steps the step-cost fit has seen before its misses teach the per-k correction (module docstring, 3).
CORRECTION_AFTER_STEPS = 8


def backed_off(interval_s: float, base_s: float, max_factor: float, reset: bool, ran: bool) -> float:
    """The next interval of an occasional step (exploration, probe): back to ``base_s`` on ``reset``, else doubled,
    up to ``max_factor`` x ``base_s``, each time one ``ran`` and left the policy where it was."""
    if reset:
        return base_s
    return min(2.0 * interval_s, base_s * max_factor) if ran else interval_s


@dataclass(frozen=True, slots=True)
class AdaptiveParams:
    # Largest k searched, capped by the engine's max_k (the engine's where unset). Deep positions are learned from
    # exploration steps.
    max_k: int | None = None
    ema_half_life_steps: float = 20.0
    prior_alpha: float = 0.5
    probe_interval_s: float = 2.0
    probe_k: int = 1
    # Each probe after which k stays 0 doubles the probe interval, up to this many times the base (module docstring,
    # last paragraph); the policy choosing k > 0 resets it. 1: a probe every ``probe_interval_s``, as in goodput.
    probe_backoff_max: float = 1.0
    # At k = 0, probe as soon as none of the requests the acceptance estimate last learned from is running, and let
    # the probe's verdicts outweigh their evidence (``parts.probe.ZeroProbe``), not only on the clock. On: served at
    # one client it ended a 4 s lock-in at k = 0; the simulator's leaderboard and tuning scenarios never fire it.
    probe_on_turnover: bool = True
    latency_half_life_steps: float = 1000.0
    # Relative gain over k = 0 needed to speculate at all (``GoodputCore.best_k``).
    min_gain: float = 0.02
    # Relative gain over the current k > 0 needed to move to another k, 0 included.
    switch_margin: float = 0.03
    # Where drafts are made a step ahead (vLLM), stop speculating on a step carrying prefill only if the decodes alone
    # agree (module docstring, 2). Off: each step's prefill, priced at the margin, may stop it on its own.
    hold_stops_on_prefill: bool = True
    explore_interval_s: float = 2.0
    # Each exploration after which k still holds doubles the interval, up to this many times the base: a k
    # that keeps winning needs less checking (Nightjar's exploration probability decays too, §5.2).
    explore_backoff_max: float = 8.0
    # Steps an exploration up to k + 1 lasts; 0: what the engine needs to verify a draft at k + 1 (2 where drafts are
    # made a step ahead of their verification, as in vLLM, else 1).
    explore_up_steps: int = 0
    # Every n-th exploration down goes to k = 0 (``parts.probe.NeighbourExplorer``), so the step-cost fit measures a
    # step without draft passes instead of extrapolating to one; 0: never (the default until the simulator's
    # leaderboard has been re-run with it).
    explore_zero_every: int = 0
    # Samples each (batch bucket, k) offset remembers (``estimators.bucket_correction``).
    correction_memory: float = 20.0
    # Samples the per-bucket level common to every k remembers (``estimators.bucket_correction``); inf: none.
    level_memory: float = 4.0
    # Let draft confidences end the draft loop where the engine asks (module docstring, 6); false prices k as on an
    # engine that cannot stop early (vLLM today), for comparing like with like.
    confidence_stop: bool = True
    # Drafts granted beyond k when confidences may stop the loop.
    early_stop_extra: int = 2
    # Where drafts are verified a step after they were made (vLLM), cut them to their confident prefix before
    # verification (module docstring, 6). Off: k is priced as if all were verified, and cutting wastes passes.
    verify_confident_prefix: bool = False
    # Read a confidence as the acceptance drafts of that confidence have had (``estimators.confidence_calibration``)
    # rather than as the acceptance itself; false is AdaSpec's Eq. 7 as written.
    calibrate_confidence: bool = True
    # Seconds within which the predicted gain of resuming must repay the draft's catch-up (module docstring, 5).
    resume_payback_s: float = 1.0
    # Never pick a k whose KV slots would make the step preempt (module docstring, 7; ``parts.kv_fit``).
    kv_fit: bool = True
    # Learn each timed part of a step on its own, where the engine times them (module docstring, 1): off, the fit
    # learns whole steps only, as before the parts were timed.
    timed_parts: bool = True
    # Weigh the step-cost fit's pull toward its prior by the steps this engine runs rather than a GPU-typical step
    # (``StepLatencyModel``'s ``data_scales``): on a compute-bound engine at a few requests the fixed scales keep the
    # target's per-token cost near the prior's, and k stays where the prior puts it. Off: the GPU-typical scales.
    latency_data_scales: bool = True

    def __post_init__(self) -> None:
        checks = {
            "max_k": self.max_k is None or self.max_k >= 0,
            "ema_half_life_steps": self.ema_half_life_steps > 0,
            "prior_alpha": 0.0 <= self.prior_alpha <= 1.0,
            "probe_interval_s": self.probe_interval_s > 0,
            "probe_k": self.probe_k >= 1,
            "latency_half_life_steps": self.latency_half_life_steps > 0,
            "min_gain": 0.0 <= self.min_gain < 1.0,
            "switch_margin": 0.0 <= self.switch_margin < 1.0,
            "explore_interval_s": self.explore_interval_s > 0,
            "correction_memory": self.correction_memory >= 1.0,
            "level_memory": self.level_memory >= 1.0,
            "explore_backoff_max": self.explore_backoff_max >= 1.0,
            "probe_backoff_max": self.probe_backoff_max >= 1.0,
            "explore_up_steps": self.explore_up_steps >= 0,
            "explore_zero_every": self.explore_zero_every >= 0,
            "early_stop_extra": self.early_stop_extra >= 0,
            "resume_payback_s": self.resume_payback_s >= 0,
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
        # Largest k searched: the engine's buffers cap what the user asked for.
        self.max_k = largest_k(params.max_k, traits)
        self.core = GoodputCore(
            self.max_k,
            ema_half_life_steps=params.ema_half_life_steps,
            prior_alpha=params.prior_alpha,
            probe_interval_s=params.probe_interval_s,
            probe_k=params.probe_k,
            min_gain=params.min_gain,
            explore_interval_s=params.explore_interval_s,
            explore_up_steps=params.explore_up_steps or up_steps_for(traits.drafts_ahead),
            explore_zero_every=params.explore_zero_every,
            probe_on_turnover=params.probe_on_turnover,
        )
        # Refitted every 8 steps: a 21-coefficient solve per step would cost more than the rest of the policy.
        features = HINGED if params.timed_parts else replace(HINGED, parts=False)
        self.latency = StepLatencyModel(
            features,
            half_life_steps=params.latency_half_life_steps,
            refit_every=8,
            data_scales=params.latency_data_scales,
        )
        self.correction = BucketCorrection(params.correction_memory, level_memory=params.level_memory)
        self.calibration = ConfidenceCalibration() if params.calibrate_confidence else None
        # The k the policy itself chose last (exploration and probe steps aside).
        self._k = 0
        self._explorations_seen = 0
        self._probes_seen = 0
        # Shared with every draft-loop rule handed out, so describe() can report their early stops.
        self._early_stops = StopCounter()
        self._lag = DraftLag()
        self.num_resumes_deferred = 0
        # Steps whose k was cut so that their KV slots fit the free blocks (module docstring, 7).
        self.num_kv_cuts = 0

    def choose(self, ctx: StepContext) -> Decision:
        self._lag.see(ctx.draft_resident)
        if not ctx.draft_resident:
            return Decision(k=0)
        if ctx.num_running == 0:
            # Nothing decodes, so k changes nothing this step; keeping it avoids two switches per idle gap.
            return Decision(k=self._k)
        seconds, goodputs = self._prices(ctx)
        current = min(self._k, self.max_k)
        k, deferred = self._pick(ctx, goodputs, current)
        stopping_on_a_prompt = k == 0 < current and ctx.num_prefill_tokens > 0
        if stopping_on_a_prompt and self.traits.drafts_ahead and self.params.hold_stops_on_prefill:
            alone = replace(ctx, num_prefill_tokens=0)
            held = self._pick(alone, self._prices(alone)[1], current)
            if held[0] > 0:
                k, deferred = held
        self.num_resumes_deferred += int(deferred)
        self._back_off_exploration(k)
        self._back_off_probe(k)
        self._k = k
        run_k = self.core.run(ctx.now_s, k, goodputs, ctx.request_ids)
        if self.params.kv_fit:
            # Only what runs is cut: the policy's own k stays, so it returns once the pool has room.
            fitting = largest_fitting_k(ctx, run_k)
            self.num_kv_cuts += int(fitting < run_k)
            run_k = fitting
        # A probe (k = 0 chosen) or an exploration down to 0 runs as it is; a speculating step may run on.
        if k > 0 and run_k > 0 and self.params.confidence_stop and self.traits.asks_stop_drafting:
            budget = min(run_k + self.params.early_stop_extra, self.max_k)
            if self.params.kv_fit:
                budget = largest_fitting_k(ctx, budget)
            stop = ConfidenceStop(
                ctx.num_running, seconds, self.core.acceptance.alphas(), budget, self._early_stops, self._calibrate
            )
            return Decision(k=budget, draft_stop=stop)
        verify_prefix = self.params.verify_confident_prefix and self.traits.verifies_confident_prefix
        if k > 0 and run_k > 0 and self.params.confidence_stop and verify_prefix:
            # The drafts to verify were made last step; this step drafts run_k whatever it verifies, so the rule
            # prices verifying n of them with run_k passes in every row.
            verify = np.maximum(self.decode_seconds_all(ctx, passes=run_k), MIN_STEP_S).tolist()
            stop = ConfidenceStop(
                ctx.num_running, verify, self.core.acceptance.alphas(), run_k, self._early_stops, self._calibrate
            )
            return Decision(k=run_k, draft_stop=stop)
        return Decision(k=run_k)

    def _prices(self, ctx: StepContext) -> tuple[list[float], list[float]]:
        """Per k = 0 .. max_k, the decodes' seconds and their predicted tokens per second."""
        seconds = np.maximum(self.decode_seconds_all(ctx), MIN_STEP_S).tolist()
        return seconds, self.core.goodputs(ctx.num_running, seconds)

    def _pick(self, ctx: StepContext, goodputs: Sequence[float], current: int) -> tuple[int, bool]:
        """The k these prices choose from ``current``, after the margins; and whether a resume was deferred."""
        k = self.core.best_k(goodputs)
        if k != current and current > 0 and goodputs[k] < goodputs[current] * (1.0 + self.params.switch_margin):
            k = current
        if k > 0 and current == 0 and not self._resume_pays(ctx, goodputs[k] - goodputs[0], goodputs[0]):
            return 0, True
        return k, False

    def _resume_pays(self, ctx: StepContext, gain_tokens_per_s: float, k0_tokens_per_s: float) -> bool:
        """Whether the gain over k = 0 repays, within ``resume_payback_s``, the tokens the catch-up step costs."""
        resume = self.traits.resume_s_per_token
        if resume is None:
            return True
        # Priced at the mean lag, at most the mean context: the catch-up is one forward over every request's lag.
        mean_context = ctx.num_context_tokens / max(ctx.num_running, 1)
        lag = min(self._lag.effective(ctx.num_context_tokens, ctx.num_running), mean_context)
        cost_s = measured_resume_s(resume, lag, ctx.num_running)
        return gain_tokens_per_s * self.params.resume_payback_s >= cost_s * k0_tokens_per_s

    def _back_off_exploration(self, k: int) -> None:
        explorer, params = self.core.explorer, self.params
        grew = explorer.num_explorations > self._explorations_seen
        explorer.interval_s = backed_off(
            explorer.interval_s, params.explore_interval_s, params.explore_backoff_max, k != self._k, grew
        )
        self._explorations_seen = explorer.num_explorations

    def _back_off_probe(self, k: int) -> None:
        probe, params = self.core.probe, self.params
        grew = probe.num_probes > self._probes_seen
        probe.interval_s = backed_off(probe.interval_s, params.probe_interval_s, params.probe_backoff_max, k > 0, grew)
        self._probes_seen = probe.num_probes

    def warm_start(self, history: Sequence[StepRecord]) -> None:
        """Learn acceptance from the engine's earlier steps, and step costs only from a history that ran two k or
        more. A history at one k (a fixed-k run before this policy) cannot tell the step-cost fit a draft pass
        from the fixed cost, so the fit's prior would split them, and every correction cell would inherit that
        k's residual. Warm-started on a `fixed:k=4` run, `adaptive` served 16 clients at k = 3 for most of its
        next run where k = 1-2 were best; cold, it learns the split from its own steps and explorations."""
        varied = sum(n >= WARM_MIN_STEPS_PER_K for n in Counter(r.num_draft_passes for r in history).values()) >= 2
        for record in history:
            if varied:
                self.observe(record)
            else:
                self._observe_acceptance(record)

    def seed_acceptance(self, accepted: Sequence[float], reached: Sequence[float]) -> None:
        self.core.acceptance.seed(accepted, reached)

    def observe(self, record: StepRecord) -> None:
        # The residual is taken before the fit sees the step: out of sample, like the predictions it corrects.
        fitted = record
        if self.traits.batch_expansion and record.num_drafted_per_request:
            # The target read each request's context once per scored position (module docstring, 1).
            drafting = len(record.num_drafted_per_request)
            reads = batch_expansion_context(record.num_context_tokens, drafting, record.num_drafted / drafting)
            fitted = replace(record, num_context_tokens=round(reads))
        # A cold fit's miss is the prior's, not a bias the fit keeps: left in, it stays in the offset of a k that
        # does not run again in that bucket (module docstring, 3).
        warm = self.latency.num_samples >= CORRECTION_AFTER_STEPS
        predicted_s = self.latency.observe(fitted)
        if warm:
            # Keyed by the drafts the step ran, which an early stop makes fewer than its k.
            k_run = max(record.num_drafted_per_request, default=0) or record.k
            self.correction.observe(record.num_running, k_run, record.duration_s, predicted_s)
        self._observe_acceptance(record)

    def _observe_acceptance(self, record: StepRecord) -> None:
        """What a step says besides its cost: acceptance, the confidences' calibration, the draft's lag."""
        self.core.observe(record)
        if self.calibration is not None:
            self.calibration.observe(record)
        self._lag.observe(record.k, record.num_draft_passes, record.num_batched_tokens, record.num_running)

    def decode_seconds_all(self, ctx: StepContext, passes: int | None = None) -> np.ndarray:
        """Per k = 0 .. max_k, the step's time the decodes are charged with: all of it minus the prefill's own
        marginal cost. ``passes``: every row runs that many draft passes (k drafts verified each), else k."""
        batch, prefill = ctx.num_running, ctx.num_prefill_tokens
        ks = np.arange(self.max_k + 1)
        if passes is None:
            draft_passes = np.where(ks > 0, ks, int(self.traits.k0_runs_draft_pass))
        else:
            draft_passes = np.full_like(ks, passes)
        context: float | np.ndarray = ctx.num_context_tokens
        if self.traits.batch_expansion:
            context = np.array([batch_expansion_context(ctx.num_context_tokens, batch, k) for k in ks.tolist()])
        step_s = self.latency.predict_many(context, prefill + batch * (ks + 1), draft_passes, batch)
        prefill_s = self.latency.batched_token_seconds(prefill) if prefill else 0.0
        factors = np.array(self.correction.factors(batch, self.max_k + 1))
        if passes is not None:  # the offset is kept per k run; here that is ``passes`` in every row
            factors = np.full_like(factors, factors[min(passes, self.max_k)])
        # Learned on whole steps, the factors scale the decodes' part only: a few per cent on a long prefill
        # chunk would outweigh what the drafts riding on it cost.
        return (step_s - prefill_s) * factors

    @property
    def _calibrate(self) -> Callable[[float], float] | None:
        return self.calibration.acceptance if self.calibration is not None else None

    def decode_seconds(self, ctx: StepContext, k: int) -> float:
        return float(self.decode_seconds_all(ctx)[k])

    def describe(self) -> dict[str, float]:
        out = self.core.describe(self.latency)
        out["num_early_stops"] = float(self._early_stops.count)
        if self.calibration is not None:
            out["calibration_drafts_seen"] = self.calibration.seen()
        out["draft_lag_tokens"] = float(self._lag.tokens)
        out["num_resumes_deferred"] = float(self.num_resumes_deferred)
        out["num_kv_cuts"] = float(self.num_kv_cuts)
        return out
