"""``adaptive``: the project's own policy, TurboSpec's goodput argmax with the changes below, one rule each.

The design for a user, and how each rule was measured and chosen, are in docs/policies/adaptive.md.

**Price with a step cost that bends.** The step-cost fit (``StepLatencyModel`` with ``HINGED`` features) is a
linear spline in batched tokens, so drafts are nearly free below the GPU's ridge point and cost their FLOPs above
it; goodput's straight line overprices k at small batches and underprices it at large ones. Where the engine times
a step's parts (the target's pass, the draft's passes) each is learned on its own, since a step held at one k
cannot say which of its costs grow with k. The fit's pull toward its prior is weighed by this engine's own steps
(``data_scales``), so a CPU's small steps are not priced like a GPU's. Where the target verifies by batch
expansion (``EngineTraits.batch_expansion``) the fit's context is the reads it makes (AdaSpec, Eq. 4).

**Charge the decodes only what they add to a prefill.** A chunked-prefill step carries P prompt tokens whatever k
is. The decodes pay ``D(k) = T(P + B(k + 1), passes(k)) - (T(P, 0) - T(0, 0))`` and k maximises ``B * l(k) /
D(k)``: charging the whole step makes speculation look like it amortises a fixed cost, ignoring P misses that P
pushes the step past the ridge point.

**Correct the fit per batch bucket and k** (``estimators.bucket_correction``): its out-of-sample miss, as a
ratio per power-of-two batch bucket (Nightjar, §5.2), split into a level common to every k, which follows the
machine's phases, and per k an offset from it. The correction learns only once the fit has seen
``CORRECTION_AFTER_STEPS`` steps: a cold fit's miss is its prior's and, kept as the offset of a k that does not
run again, would price that k for good.

**Pick with margins.** Speculating at all must add ``min_gain`` over k = 0; leaving the current k > 0 (for k = 0
too) must gain ``switch_margin``, since every switch re-sizes the draft's batch and cuts drafts already made.
Where k = 0 skips the draft pass (``EngineTraits.resume_s_per_token``), resuming must repay the draft's catch-up
over the tokens it skipped within ``resume_payback_s`` (Nightjar prices the same switch per token, its Eq. 4).

**Hold a stop or a start that only a prompt asks for.** Where drafts are made a step ahead of their verification
(vLLM), a stop on a step carrying prompt tokens stands only if the decodes alone would stop too: such a stop throws
away the drafts made for this step and makes none for the next, so it lasts two steps however briefly the prices
favour it. A start from k = 0 there stands only if the decodes alone would keep it: on such a step k = 0 runs the
draft's pass too, so a start looks cheap, but its drafts count only if the next step, a decode step, speculates as
well. Moves between two k > 0 throw nothing away and are not held.

**Keep learning: explorations and probes** (``parts.goodput_core``, shared with ``goodput``). A settled k > 0 is
left for one step at a neighbouring k every ``explore_interval_s``, backing off (doubling, up to
``explore_backoff_max`` x) while the explorations leave k where it is; where drafts are made a step ahead a step up
lasts two steps. Cold, acceptance starts from ``prior_alpha``; at k = 0 a probe at ``probe_k`` runs every
``probe_interval_s``, and at once when none of the requests the estimate learned from is still running, the
estimate then forgetting their evidence down to the prior's weight. Such turnover probes back off (each one after
which k stays 0 doubles the turnovers the next waits for, up to ``probe_turnover_backoff_max``): where k = 0 skips
the draft, a probe also pays the draft's catch-up over every running request's context, and on traffic whose
every request is as unpredictable as the last (random prompts), a probe at every turnover cost more than a tenth
of the throughput of staying at k = 0.

**Never run a k that preempts** (``parts.kv_fit``). When the KV pool is nearly full the k that runs is cut to the
largest whose new blocks fit the free ones (``StepContext.kv_blocks_needed``): a preempted request recomputes its
whole context, which no draft repays. The policy's own k is kept, so it returns once the pool has room.

**Let confidences end the draft loop** (``parts.early_stop``) where the engine asks after each draft pass
(``EngineTraits.asks_stop_drafting``): the step is granted ``early_stop_extra`` drafts beyond k and stops once the
drafts' confidences say further passes lower the same objective (AdaSpec's execute-correct loop, §5.1, stops early
only). A confidence is read as the acceptance drafts of that confidence have had
(``estimators.confidence_calibration``), not as the acceptance itself (AdaSpec, Eq. 7): real drafts are rarely
calibrated. Where drafts are verified a step after they were made (vLLM) there is no loop to stop, and every draft
made is verified.

**Give each request the drafts it is worth** (``parts.per_request``, ``per_request``): each running request's own
acceptance, shrunk toward the batch's by as little as the batch's requests differ, caps its drafts where its next
draft is worth less than the verified token it costs; the batch k is the largest cap, and a k is priced with its
caps. A batch whose requests accept alike is priced exactly as one k prices it.

No separate SLO guard: for a fixed batch, maximising ``B * l(k) / D(k)`` is minimising the decodes' TPOT
``D(k) / l(k)``, which is what AdaSpec's SLO-aware efficiency (§5.3) protects.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from specserve.speculation.estimators.bucket_correction import BucketCorrection
from specserve.speculation.estimators.confidence_calibration import ConfidenceCalibration
from specserve.speculation.estimators.slo_efficiency import batch_expansion_context
from specserve.speculation.estimators.step_latency import HINGED, StepLatencyModel
from specserve.speculation.policies.parts.early_stop import ConfidenceStop, StopCounter
from specserve.speculation.policies.parts.goodput_core import MIN_STEP_S, GoodputCore, check_ranges, core_checks
from specserve.speculation.policies.parts.kv_fit import largest_fitting_k
from specserve.speculation.policies.parts.per_request import CappedPlan, RequestAcceptance, capped_goodputs
from specserve.speculation.policies.parts.switching import DraftLag, measured_resume_s
from specserve.speculation.policy import Policy, largest_k, register
from specserve.speculation.types import Decision, EngineTraits, StepContext, StepRecord

# Steps at each of two draft-pass counts or more that a warm-start history needs to teach step costs.
WARM_MIN_STEPS_PER_K = 16
# Steps the step-cost fit has seen before its misses teach the per-k correction (module docstring).
CORRECTION_AFTER_STEPS = 8
# Refit the step-cost fit every this many steps: a 21-coefficient solve per step would cost more than the rest of
# the policy.
REFIT_EVERY_STEPS = 8
# The same while the policy's own k is 0. Its steps then teach the fit little it did not know (no draft passes but a
# probe's, one more context token a request), the fit forgets over a thousand steps, and each refit re-prices a
# held k = 0 (``_held_zero``): on the tiny pair served with random prompts, refits alone forced 58 % of the
# re-priced steps, and a re-priced step, run between forward passes, cost about 0.35 ms.
REFIT_EVERY_STEPS_AT_ZERO = 32


def backed_off(interval_s: float, base_s: float, max_factor: float, reset: bool, ran: bool) -> float:
    """The next interval of an occasional step (an exploration): back to ``base_s`` on ``reset``, else doubled, up
    to ``max_factor`` x ``base_s``, each time one ``ran`` and left the policy where it was."""
    if reset:
        return base_s
    return min(2.0 * interval_s, base_s * max_factor) if ran else interval_s


@dataclass(frozen=True, slots=True)
class AdaptiveParams:
    # Largest k searched, capped by the engine's max_k (the engine's where unset). Deep positions are learned from
    # exploration steps.
    max_k: int | None = None
    # Acceptance EWMA half-life in speculative steps (``parts.goodput_core``).
    ema_half_life_steps: float = 20.0
    # Acceptance assumed before any sample: a cautious cold start.
    prior_alpha: float = 0.5
    # Seconds at k = 0 between probes, and the k a probe runs.
    probe_interval_s: float = 2.0
    probe_k: int = 1
    # A probe also runs once the batch has turned over (none of the requests the estimate learned from still
    # runs); each such probe after which k stays 0 doubles the turnovers the next one waits for, up to this many.
    # 1: a probe at every turnover.
    probe_turnover_backoff_max: int = 8
    # Step-cost fit half-life in steps: step cost drifts slowly.
    latency_half_life_steps: float = 1000.0
    # Relative gain over k = 0 needed to speculate at all (``GoodputCore.best_k``).
    min_gain: float = 0.02
    # Relative gain over the current k > 0 needed to move to another k, 0 included.
    switch_margin: float = 0.03
    # Seconds of a settled k between explorations of a neighbouring k.
    explore_interval_s: float = 2.0
    # Each exploration after which k still holds doubles the interval, up to this many times the base: a k
    # that keeps winning needs less checking (Nightjar's exploration probability decays too, §5.2).
    explore_backoff_max: float = 8.0
    # Drafts granted beyond k where the engine lets confidences stop the draft loop.
    early_stop_extra: int = 2
    # Seconds within which the predicted gain of resuming must repay the draft's catch-up.
    resume_payback_s: float = 1.0
    # Cap each request's drafts by its own acceptance (``parts.per_request``); false: one k for the whole batch. Off
    # by default: its plan costs about as much per step as the rest of the policy (docs/policies/adaptive.md,
    # "Per-request caps").
    per_request: bool = False

    def __post_init__(self) -> None:
        checks = core_checks(self) | {
            "latency_half_life_steps": self.latency_half_life_steps > 0,
            "switch_margin": 0.0 <= self.switch_margin < 1.0,
            "explore_backoff_max": self.explore_backoff_max >= 1.0,
            "early_stop_extra": self.early_stop_extra >= 0,
            "resume_payback_s": self.resume_payback_s >= 0,
            "probe_turnover_backoff_max": self.probe_turnover_backoff_max >= 1,
        }
        check_ranges(self, checks)


@register
class AdaptivePolicy(Policy):
    """Argmax of marginal goodput under a piecewise-linear step cost, with hysteresis."""

    name = "adaptive"
    Params = AdaptiveParams

    def __init__(self, params: AdaptiveParams, traits: EngineTraits) -> None:
        super().__init__(params, traits)
        # Largest k searched: the engine's buffers cap what the user asked for.
        self.max_k = largest_k(params.max_k, traits)
        self.core = GoodputCore.from_params(
            self.max_k, params, traits, probe_on_turnover=True, max_turnovers=params.probe_turnover_backoff_max
        )
        self.latency = StepLatencyModel(
            HINGED, half_life_steps=params.latency_half_life_steps, refit_every=REFIT_EVERY_STEPS, data_scales=True
        )
        self.correction = BucketCorrection()
        self.calibration = ConfidenceCalibration()
        # The k the policy itself chose last (exploration and probe steps aside).
        self._k = 0
        self._explorations_seen = 0
        # Shared with every draft-loop rule handed out, so describe() can report their early stops.
        self._early_stops = StopCounter()
        self._lag = DraftLag()
        self.num_resumes_deferred = 0
        # Steps whose k was cut so that their KV slots fit the free blocks.
        self.num_kv_cuts = 0
        self.requests = RequestAcceptance(params.ema_half_life_steps) if params.per_request else None
        # Steps that capped some request below the step's k.
        self.num_capped_steps = 0
        # k = 0 .. max_k and their draft passes (as floats, the step-cost fit's unit): priced every step.
        self._ks = np.arange(self.max_k + 1)
        self._ks_draft_passes = self._draft_passes(self._ks).astype(np.float64)
        # The same on a step that carries prompt tokens, where k = 0 runs the draft's pass even if it skips it on
        # a pure decode step (``_k0_runs_draft_pass``).
        self._ks_draft_passes_prefill = self._draft_passes(self._ks, k0_runs=True).astype(np.float64)
        # Steps with drafts observed: each can move the acceptance estimate.
        self._verdict_steps = 0
        # What a k = 0 held since its last pricing needs to be held again without one (``_held_zero``): the inputs
        # that priced it (batch, step-cost fit, verdicts, probes) and the prices.
        self._zero_priced: tuple[tuple[int, int, int, int], list[float]] | None = None
        self.num_held_zero_steps = 0
        # Steps at k = 0 without drafts, learned from in one go before anything reads what they teach
        # (``observe``).
        self._deferred: list[StepRecord] = []

    def choose(self, ctx: StepContext) -> Decision:
        self._lag.see(ctx.draft_resident)
        if not ctx.draft_resident:
            self._zero_priced = None
            return Decision(k=0)
        if ctx.num_running == 0:
            # Nothing decodes, so k changes nothing this step; keeping it avoids two switches per idle gap.
            return Decision(k=self._k)
        held = self._held_zero(ctx)
        if held is not None:
            # ``_settle(0, False)`` would change nothing (no exploration runs at k = 0), nor would ``_stop_rule``
            # (no draft-stop rule for a k the policy did not choose), so a held step skips both.
            self.num_held_zero_steps += 1
            return Decision(k=self._fit_to_kv(ctx, self.core.run(ctx.now_s, 0, held, ctx.request_ids)))
        self._learn_deferred()
        if self.requests is not None:
            self.requests.keep_only(ctx.request_ids)
        seconds, goodputs, plan = self._prices(ctx)
        current = min(self._k, self.max_k)
        k, deferred = self._hold_prompt_switch(ctx, current, self._pick(ctx, goodputs, current))
        self._settle(k, deferred)
        key = self._zero_key(ctx) if k == 0 and not deferred else None
        self._zero_priced = (key, goodputs) if key is not None else None
        run_k = self._fit_to_kv(ctx, self.core.run(ctx.now_s, k, goodputs, ctx.request_ids))
        caps = plan.caps_to_run(k, run_k, ctx.request_ids) if plan is not None else ()
        self.num_capped_steps += int(bool(caps))
        return self._stop_rule(ctx, k, run_k, seconds, caps)

    def _zero_key(self, ctx: StepContext) -> tuple[int, int, int, int] | None:
        """What a k = 0 priced on this step may be held over (``_held_zero``): the batch, the step-cost fit's refits,
        the verdicts and the probes so far; None where no held k = 0 applies (prompt tokens in the step, per-request
        caps)."""
        if ctx.num_prefill_tokens or self.requests is not None:
            return None
        return (ctx.num_running, self.latency.fit_version, self._verdict_steps, self.core.probe.num_probes)

    def _held_zero(self, ctx: StepContext) -> list[float] | None:
        """The goodputs of the last step priced to k = 0, where nothing that moves a choice has moved since: the
        same batch, pure decodes, no refit of the step-cost fit, no new verdict and no probe. Between two such
        moves a k = 0 step only grows the context by one token a request, and re-pricing it cost most of the
        policy's time on a held k = 0 (about 0.1 ms of the tiny pair's 4-5 ms steps on a served CPU engine). The
        fit refits every ``REFIT_EVERY_STEPS_AT_ZERO`` steps at k = 0, so a held k = 0 is re-priced at least that
        often."""
        if self._zero_priced is None or self._k != 0:
            return None
        key, goodputs = self._zero_priced
        return goodputs if key == self._zero_key(ctx) else None

    def _prices(self, ctx: StepContext) -> tuple[list[float], list[float], CappedPlan | None]:
        """Per k = 0 .. max_k, the decodes' seconds at that k for every request and their predicted tokens per
        second, each k with its per-request caps where some request's acceptance stands apart (the plan)."""
        seconds = [max(s, MIN_STEP_S) for s in self._decode_seconds_every_k(ctx)]
        plan = self._plan(ctx)
        return seconds, plan.goodputs if plan else self.core.goodputs(ctx.num_running, seconds), plan

    def _plan(self, ctx: StepContext) -> CappedPlan | None:
        if self.requests is None or len(ctx.request_ids) != ctx.num_running:
            return None
        acceptance = self.core.acceptance
        survival = self.requests.survival(ctx.request_ids, acceptance.alphas(), acceptance.num_reached(), self.max_k)
        if survival is None:
            return None
        factors = np.array(self.correction.factors(ctx.num_running, self.max_k + 1))
        return capped_goodputs(survival, partial(self.decode_seconds_many, ctx, factors=factors), MIN_STEP_S)

    def _pick(self, ctx: StepContext, goodputs: Sequence[float], current: int) -> tuple[int, bool]:
        """The k these prices choose from ``current``, after the margins; and whether a resume was deferred."""
        k = self.core.best_k(goodputs)
        if k != current and current > 0 and goodputs[k] < goodputs[current] * (1.0 + self.params.switch_margin):
            k = current
        if k > 0 and current == 0 and not self._resume_pays(ctx, goodputs[k] - goodputs[0], goodputs[0]):
            return 0, True
        return k, False

    def _hold_prompt_switch(self, ctx: StepContext, current: int, picked: tuple[int, bool]) -> tuple[int, bool]:
        """Where drafts are made a step ahead, a stop (``current`` > 0 to 0) on a step carrying prompt tokens stands
        only if the decodes alone would stop too, and a start (0 to k > 0) only if the decodes alone would keep it.
        A stop throws away the drafts made for this step and the next. A start is asked for by the pass k = 0 runs
        on such a step anyway (``_k0_runs_draft_pass``): its drafts are verified only if the next step, a decode
        step, still speculates, so a start the decodes would undo makes drafts nobody verifies, and, counted as
        speculating, keeps the probes that would measure acceptance from running."""
        stopping = picked[0] == 0 < current
        starting = current == 0 < picked[0]
        if not ((stopping or starting) and ctx.num_prefill_tokens > 0 and self.traits.drafts_ahead):
            return picked
        alone = replace(ctx, num_prefill_tokens=0)
        goodputs = self._prices(alone)[1]
        if stopping:
            held = self._pick(alone, goodputs, current)
            return held if held[0] > 0 else picked
        kept = self._pick(alone, goodputs, picked[0])[0]
        return picked if kept > 0 else (0, False)

    def _settle(self, k: int, deferred: bool) -> None:
        """Make ``k`` the policy's own, backing exploration off while it confirms the k the policy keeps."""
        self.num_resumes_deferred += int(deferred)
        self._back_off_exploration(k)
        self._k = k
        self.latency.refit_every = REFIT_EVERY_STEPS_AT_ZERO if k == 0 else REFIT_EVERY_STEPS

    def _fit_to_kv(self, ctx: StepContext, run_k: int) -> int:
        """``run_k`` cut to the largest k whose KV blocks fit; only what runs is cut, so the policy's own k stays
        and it returns once the pool has room."""
        fitting = largest_fitting_k(ctx, run_k)
        self.num_kv_cuts += int(fitting < run_k)
        return fitting

    def _stop_rule(
        self, ctx: StepContext, k: int, run_k: int, seconds: list[float], caps: tuple[tuple[str, int], ...]
    ) -> Decision:
        """The step's decision: ``run_k`` with ``caps``, or where the engine asks after each draft pass, a budget
        beyond it with the confidence rule that ends the loop. A probe (``k`` = 0) or an exploration down to 0 runs
        as it is."""
        if not (k > 0 and run_k > 0 and self.traits.asks_stop_drafting):
            return Decision(k=run_k, max_k_per_request=caps)
        budget = largest_fitting_k(ctx, min(run_k + self.params.early_stop_extra, self.max_k))
        alphas = self.core.acceptance.alphas()
        stop = ConfidenceStop(ctx.num_running, seconds, alphas, budget, self._early_stops, self.calibration.acceptance)
        return Decision(k=budget, max_k_per_request=caps, draft_stop=stop)

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

    def warm_start(self, history: Sequence[StepRecord]) -> None:
        """Learn acceptance from the engine's earlier steps, and step costs only from a history that ran two k or
        more. A history at one k (a fixed-k run before this policy) cannot tell the step-cost fit a draft pass
        from the fixed cost, so the fit's prior would split them, and every correction cell would inherit that
        k's residual. Warm-started on a `fixed:k=4` run, `adaptive` served 16 clients at k = 3 for most of its
        next run where k = 1-2 were best; cold, it learns the split from its own steps and explorations."""
        self._learn_deferred()
        varied = sum(n >= WARM_MIN_STEPS_PER_K for n in Counter(r.num_draft_passes for r in history).values()) >= 2
        for record in history:
            if varied:
                self._learn(record)
            else:
                self._observe_acceptance(record)

    def seed_acceptance(self, accepted: Sequence[float], reached: Sequence[float]) -> None:
        self.core.acceptance.seed(accepted, reached)
        self._zero_priced = None

    def observe(self, record: StepRecord) -> None:
        """Learn from a step. A k = 0 step without drafts (most steps of a held k = 0) waits, with the others like
        it, until a step priced afresh, a step with drafts or the step-cost fit's next refit needs what they teach;
        then all are learned from in order, exactly as one by one. Each step's learning, run between two forward
        passes that push the policy out of the CPU's caches, cost several times its warm time; a run of them pays
        that once."""
        if record.k == 0 and record.num_drafted == 0 and self.requests is None:
            if len(self._deferred) + 1 < self.latency.observes_until_refit():
                self._deferred.append(record)
                return
        self._learn_deferred()
        self._learn(record)

    def _learn_deferred(self) -> None:
        if self._deferred:
            for record in self._deferred:
                self._learn(record)
            self._deferred.clear()

    def _learn(self, record: StepRecord) -> None:
        # The residual is taken before the fit sees the step: out of sample, like the predictions it corrects.
        fitted = record
        if self.traits.batch_expansion and record.num_drafted_per_request:
            # The target read each request's context once per scored position (module docstring).
            drafting = len(record.num_drafted_per_request)
            reads = batch_expansion_context(record.num_context_tokens, drafting, record.num_drafted / drafting)
            fitted = replace(record, num_context_tokens=round(reads))
        # A cold fit's miss is the prior's, not a bias the fit keeps: left in, it stays in the offset of a k that
        # does not run again in that bucket (module docstring).
        warm = self.latency.num_samples >= CORRECTION_AFTER_STEPS
        predicted_s = self.latency.observe(fitted)
        if warm:
            # Keyed by the drafts the step ran, which an early stop makes fewer than its k.
            k_run = max(record.num_drafted_per_request, default=0) or record.k
            self.correction.observe(record.num_running, k_run, record.duration_s, predicted_s)
        self._observe_acceptance(record)

    def _observe_acceptance(self, record: StepRecord) -> None:
        """What a step says besides its cost: acceptance, the confidences' calibration, the draft's lag."""
        self._verdict_steps += int(record.num_drafted > 0)
        self.core.observe(record)
        if self.requests is not None:
            self.requests.observe(record)
        self.calibration.observe(record)
        self._lag.observe(record.k, record.num_draft_passes, record.num_batched_tokens, record.num_running)

    def decode_seconds_all(self, ctx: StepContext) -> np.ndarray:
        """Per k = 0 .. max_k, the step's time the decodes are charged with: all of it minus the prefill's own
        marginal cost."""
        self._learn_deferred()
        return np.array(self._decode_seconds_every_k(ctx))

    def _decode_seconds_every_k(self, ctx: StepContext) -> list[float]:
        """``decode_seconds_all`` as a list. Every step prices every k at its batch and prefill, which repeat from
        step to step, so the fit keeps what does not depend on the context (``StepLatencyModel.predict_shapes``)
        and these are the same operations as ``decode_seconds_many``'s on the same shapes."""
        ks = self._ks
        if self.traits.batch_expansion:  # the context differs per k
            return self.decode_seconds_many(ctx, ctx.num_running * ks, ks).tolist()
        batch, prefill = ctx.num_running, ctx.num_prefill_tokens
        k0_runs = self._k0_runs_draft_pass(ctx)
        passes = self._ks_draft_passes_prefill if k0_runs else self._ks_draft_passes
        step_s = self.latency.predict_shapes(
            (batch, prefill, k0_runs), ctx.num_context_tokens, lambda: (prefill + batch + batch * ks, passes), batch
        )
        prefill_s = self.latency.batched_token_seconds(prefill) if prefill else 0.0
        factors = self.correction.factors(batch, self.max_k + 1)
        return [(s - prefill_s) * f for s, f in zip(step_s, factors, strict=True)]

    def decode_seconds_many(
        self, ctx: StepContext, drafts: np.ndarray, passes: np.ndarray, factors: np.ndarray | None = None
    ) -> np.ndarray:
        """``decode_seconds_all`` for steps that verify ``drafts`` drafts over all requests with ``passes`` draft
        passes (0 to max_k), one per row: per-request caps verify fewer drafts than the batch's k allows.
        ``factors``: the correction's per-k factors at this batch, where the caller prices many shapes. Called while
        pricing, after ``choose`` or ``decode_seconds_all`` has learned the deferred steps."""
        batch, prefill = ctx.num_running, ctx.num_prefill_tokens
        every_k = passes is self._ks
        k0_runs = self._k0_runs_draft_pass(ctx)
        if every_k:
            draft_passes = self._ks_draft_passes_prefill if k0_runs else self._ks_draft_passes
        else:
            draft_passes = self._draft_passes(passes, k0_runs)
        context: float | np.ndarray = ctx.num_context_tokens
        if self.traits.batch_expansion:
            per_request = (drafts / max(batch, 1)).tolist()
            context = np.array([batch_expansion_context(ctx.num_context_tokens, batch, k) for k in per_request])
        step_s = self.latency.predict_many(context, prefill + batch + drafts, draft_passes, batch)
        prefill_s = self.latency.batched_token_seconds(prefill) if prefill else 0.0
        if factors is None:
            factors = np.array(self.correction.factors(batch, self.max_k + 1))
        if not every_k:  # at every k in order the factors are already aligned
            factors = factors[passes]
        # Learned on whole steps, the factors scale the decodes' part only: a few per cent on a long prefill
        # chunk would outweigh what the drafts riding on it cost.
        return (step_s - prefill_s) * factors

    def _draft_passes(self, passes: np.ndarray, k0_runs: bool | None = None) -> np.ndarray:
        """The draft passes a step with ``passes`` (its k) runs: one at k = 0 where that runs the draft's pass
        (``k0_runs``, the engine's trait unless given), at most one where one pass proposes every draft."""
        k0_passes = int(self.traits.k0_runs_draft_pass if k0_runs is None else k0_runs)
        return np.where(passes > 0, np.minimum(passes, 1) if self.traits.one_proposer_pass else passes, k0_passes)

    def _k0_runs_draft_pass(self, ctx: StepContext) -> bool:
        """Whether k = 0 runs the draft's pass on this step. Where the engine skips it at k = 0, it skips it only
        on pure decode steps: a prompt chunk or a new request always reaches the draft (``draft_sync``'s
        ``skips_draft_pass``, which the engine and the simulator run), and that pass also catches every lagging
        request up. Priced without it, k = 0 looked a pass cheaper than it is on every such step: under a
        saturated closed loop of 256 clients (Llama-3.1-8B + 1B draft, H100 profile), where most steps carry
        prompt tokens, ``adaptive`` ran k = 0 at 0.86 x the throughput of k = 1."""
        return self.traits.k0_runs_draft_pass or ctx.num_prefill_tokens > 0

    def decode_seconds(self, ctx: StepContext, k: int) -> float:
        return float(self.decode_seconds_all(ctx)[k])

    def describe(self) -> dict[str, float]:
        self._learn_deferred()
        out = self.core.describe(self.latency)
        out["num_early_stops"] = float(self._early_stops.count)
        out["calibration_drafts_seen"] = self.calibration.seen()
        out["draft_lag_tokens"] = float(self._lag.tokens)
        out["num_resumes_deferred"] = float(self.num_resumes_deferred)
        out["num_kv_cuts"] = float(self.num_kv_cuts)
        out["num_capped_steps"] = float(self.num_capped_steps)
        out["num_held_zero_steps"] = float(self.num_held_zero_steps)
        out["requests_tracked"] = float(len(self.requests.tracked())) if self.requests is not None else 0.0
        return out
