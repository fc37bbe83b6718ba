"""The per-step control loop inside vLLM's EngineCore (pinned: vLLM 0.32.0).

vLLM imports this module in the EngineCore process when it resolves ``scheduler_cls``. Each step:

    StepContext -> policy.choose -> k -> vLLM schedules (drafts verified <= k, k drafted next)
    -> the step runs -> StepRecord -> policy.observe

Nothing here crosses a process boundary on the hot path. Private vLLM interfaces used:
``Scheduler.schedule`` / ``update_from_output`` / ``has_unfinished_requests``,
``SchedulerOutput.num_spec_tokens_to_schedule`` and ``scheduled_spec_decode_tokens``,
``Request.spec_token_ids`` / ``num_computed_tokens``,
``kv_cache_manager.block_pool``, ``Scheduler.requests``, an attribute added to ``SchedulerOutput``
(``signalled_drafts.PLAN_ATTR``); its ``__init__`` installs ``utilities.py`` (specserve's ``EngineCore`` utility
methods and the ``EngineCore.post_step`` wrapper).

Each step's draft pass is decided here, once (``_plan_draft_pass``): whether it runs (the k = 0 rule, ``k0_skip.py``)
and which lagging requests it catches up (``draft_sync.plan_step``). The plan rides on the step's ``SchedulerOutput``
to the worker (``worker/extension.py``), which applies it; this side keeps each request's draft-KV bookkeeping
(``DraftKVTracker``) by the same plan and cuts the drafts of requests whose draft KV has a hole (the lag rule; see
``speculation/draft_sync.py``).
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Sequence
from typing import Any

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine.core import EngineCore
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

from specserve.messages import EngineTelemetry, LoadSnapshot, PolicySnapshot
from specserve.replicas.config.engine_args import (
    ADDITIONAL_CONFIG_KEY,
    EngineControlConfig,
)
from specserve.replicas.core.collapse_action import CollapseAction
from specserve.replicas.core.engine_path import require_engine_path
from specserve.replicas.core.telemetry import StepCounters, acceptance_estimate
from specserve.replicas.draft_memory.elastic_draft import ElasticDraft, residency_params
from specserve.replicas.engine_log import engine_logger
from specserve.replicas.k0_skip import (
    catch_up_cap,
    catch_up_room,
    engine_method,
    entering_request_ids,
    resume_cost,
    skipping_enabled,
    step_skips_draft_pass,
    tracks_draft_kv,
)
from specserve.replicas.signalled_drafts import SignalledDraftTokenIds, attach_plan, step_plan, step_timings
from specserve.speculation import (
    Decision,
    DraftStop,
    EngineTraits,
    GuardedPolicy,
    PositionAcceptance,
    StepContext,
    StepRecord,
    make_policy,
)
from specserve.speculation.confident_prefix import confident_prefix
from specserve.speculation.context import build_step_context, kv_blocks_needed, most_kv_blocks_per_decode
from specserve.speculation.draft_sync import DraftKVTracker, DraftPassPlan, ScheduledRequest, plan_step
from specserve.speculation.methods import DEFAULT_METHOD, K0, Source, method
from specserve.speculation.step_log import encode as encode_step
from specserve.speculation.types import without_acceptance

logger = engine_logger(__name__)

# Steps a newly set policy replays (``Policy.warm_start``): about the half-life of adaptive's step-cost fit.
# Replaying them pauses the engine loop once, for tens of milliseconds, between two steps.
WARM_START_STEPS = 1024


class AdaptiveKScheduler(Scheduler):
    """vLLM's scheduler with k chosen by a specserve policy every step.

    CPU vLLM forces synchronous scheduling, so this subclasses the synchronous ``Scheduler``; the
    step's wall time is then schedule() entry to update_from_output() entry.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        require_engine_path(self.vllm_config)
        # utilities.py imports this class (EngineCore's utility methods and post_step wrapper read it): imported here.
        from specserve.replicas.core import utilities

        utilities.install()
        control = EngineControlConfig.from_additional_config(
            self.vllm_config.additional_config.get(ADDITIONAL_CONFIG_KEY)
        )
        self.skips_k0_draft_pass = skipping_enabled(self.vllm_config)
        # A skipped pass leaves a lag to catch up (a draft model's KV; not n-gram lookup's, which keeps no state).
        self.tracks_draft_kv = tracks_draft_kv(self.vllm_config)
        self.method = engine_method(self.vllm_config) or method(DEFAULT_METHOD)
        # What k = 0 does on this engine: the method's rule, unless skipping is off (then the proposer runs).
        self.k0_mode = (self.method.k0 if self.skips_k0_draft_pass else K0.RUN).value
        # Each request's draft KV: the worker keeps none, it applies the plan this side makes (_plan_draft_pass).
        self.draft_kv = DraftKVTracker()
        self.catch_up_max_tokens = catch_up_cap(self.vllm_config)
        for module in control.policy_modules:
            importlib.import_module(module)  # registers the user's policies in this process
        self.traits = EngineTraits(
            max_k=self.num_spec_tokens,
            k0_runs_draft_pass=not self.skips_k0_draft_pass,
            resume_s_per_token=resume_cost(self.vllm_config) if self.skips_k0_draft_pass else None,
            verifies_confident_prefix=self.num_spec_tokens > 0 and control.draft_signals,
            drafts_ahead=True,
            # A lookup finds every draft in one search, whatever k.
            one_proposer_pass=self.method.source is Source.NONE,
        )
        # Guarded: a policy that raises or answers nonsense costs a k = 0 step and a count, never the engine.
        self.policy = GuardedPolicy(make_policy(control.policy, self.traits), logger)
        self.counters = StepCounters(max_k=self.num_spec_tokens)
        # Telemetry's acceptance estimate is the same for every policy, so operators can compare them.
        self.acceptance = PositionAcceptance(max_k=max(self.num_spec_tokens, 1))
        self.k = 0
        # request id -> (its pending drafts, their confidences, their entropies), from the worker (draft_signals.py).
        self._signals: dict[str, tuple[list[int], list[float], list[float]]] = {}
        # Whether the last executed step skipped the draft pass, so that no drafts wait in the worker.
        self.last_step_drafted_nothing = False
        # Draft residency (elastic_draft.py): the draft may be offloaded and the KV pool grown into its bytes.
        self.elastic = ElasticDraft(self, residency_params(control)) if self.num_spec_tokens > 0 else None
        # Acceptance collapse (collapse_action.py): k forced to 0, the draft restored, probed, speculation back.
        self.collapse = CollapseAction(self) if self.num_spec_tokens > 0 else None
        self._step_ctx: StepContext | None = None
        self._step_started_s = 0.0
        # When the last step ended with work left, so the engine loop went straight on to the next one: that
        # step is then timed from here, the loop's own work between steps (output processing, detokenizing,
        # new requests) included, as the simulator's fitted step times are. After an idle gap it is None.
        self._busy_since_s: float | None = None
        # One append write per step: replicas sharing the file interleave by whole lines.
        self._step_log_fd = (
            os.open(control.step_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if control.step_log else None
        )
        self._engine_id = str(os.getpid())
        # Start-up checks that failed (``end_calibration``), shown in telemetry until the engine stops.
        self.failed_checks: tuple[str, ...] = ()
        logger.info(
            "specserve: method %s, policy %s, max_k %d, k = 0: %s",
            self.method.name,
            self.policy.spec,
            self.num_spec_tokens,
            self.k0_mode,
        )

    # -- the loop ---------------------------------------------------------------------------------

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        if not self.has_unfinished_requests():
            # vLLM's step after the last request finished, which only tells the workers to free it: no step
            # for a policy to choose k for (asked, a policy's errors and probes would count a step never run).
            if self.elastic is not None:
                self.elastic.before_schedule()
            self._step_ctx = None
            return super().schedule(*args, **kwargs)
        now_s = time.monotonic()
        self._step_started_s = now_s if self._busy_since_s is None else self._busy_since_s
        ctx = self._context(now_s)
        started, started_cpu = time.perf_counter(), time.thread_time()
        decision = self.policy.choose(ctx)
        self._count_policy_time(started, started_cpu)
        k = self._batch_k(decision) if self.draft_resident else 0
        if self.collapse is not None and self.draft_resident:
            k = min(self.collapse.k(k), self.num_spec_tokens)
        if self.elastic is not None:
            self.elastic.before_schedule()
        self._truncate_drafts(k, dict(decision.max_k_per_request))
        if decision.draft_stop is not None and k > 0:
            self._verify_confident_prefix(decision.draft_stop)
        output = super().schedule(*args, **kwargs)
        if output.num_scheduled_tokens:
            output.num_spec_tokens_to_schedule = k
            self.k, self._step_ctx = k, ctx
            self.counters.num_prefill_tokens_announced += ctx.num_prefill_tokens
            attach_plan(output, self._plan_draft_pass(output))
        else:
            self._step_ctx = None
        return output

    def _count_policy_time(self, started: float, started_cpu: float) -> None:
        self.counters.policy_s += time.perf_counter() - started
        self.counters.policy_cpu_s += time.thread_time() - started_cpu

    def forget_draft_signals(self) -> None:
        self._signals = {}

    def update_draft_token_ids(self, draft_token_ids: DraftTokenIds) -> None:
        super().update_draft_token_ids(draft_token_ids)
        self.forget_draft_signals()
        # The requests still running that got drafts (one that finished this step has none to verify).
        requests = map(self.requests.get, draft_token_ids.req_ids)
        self.counters.num_draft_lists += sum(1 for r in requests if r is not None and r.spec_token_ids)
        if not isinstance(draft_token_ids, SignalledDraftTokenIds):
            return
        for req_id, confidences, entropies in zip(
            draft_token_ids.req_ids, draft_token_ids.confidences, draft_token_ids.entropies, strict=True
        ):
            request = self.requests.get(req_id)
            if request is not None and request.spec_token_ids:
                self._signals[req_id] = (list(request.spec_token_ids), confidences, entropies)
                self.counters.num_draft_lists_with_signals += int(bool(confidences))

    def update_from_output(self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput):
        ended_s = time.monotonic()
        ctx = self._step_ctx
        plan = step_plan(scheduler_output)
        skipped = plan.skip
        self.last_step_drafted_nothing = skipped
        if ctx is not None and scheduler_output.num_scheduled_tokens:
            record = self._record(ctx, scheduler_output, model_runner_output, skipped, ended_s)
            started, started_cpu = time.perf_counter(), time.thread_time()
            self.policy.observe(record)
            self._count_policy_time(started, started_cpu)
            self.acceptance.observe(record)
            self.counters.add(record)
            if self.collapse is not None:
                self.collapse.observe(record)
            if self._step_log_fd is not None:
                line = encode_step(self._engine_id, self.policy.spec, self.traits, ctx, record) + "\n"
                os.write(self._step_log_fd, line.encode())
            self.counters.num_steps_draft_skipped += int(skipped)
            self._step_ctx = None
        starts = self._starts(scheduler_output)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if self.tracks_draft_kv:
            self._track_draft_kv(plan, starts, model_runner_output)
        self._busy_since_s = ended_s if self.get_num_unfinished_requests() else None
        return outputs

    # -- pieces of the loop -----------------------------------------------------------------------

    def _context(self, now_s: float) -> StepContext:
        pool = self.kv_cache_manager.block_pool
        free = pool.get_num_free_blocks()
        return build_step_context(
            now_s=now_s,
            num_running=len(self.running),
            num_context_tokens=sum(r.num_computed_tokens for r in self.running),
            # A decoding request has exactly one token to compute; more means a prefill (or a recompute) runs.
            running_prefill_tokens=sum(
                n for n in (r.num_tokens - r.num_computed_tokens for r in self.running) if n > 1
            ),
            num_waiting=len(self.waiting),
            # A preempted request recomputes its outputs too, so it asks for all its tokens.
            waiting_tokens=(r.num_tokens - r.num_computed_tokens for r in self.waiting),
            max_num_seqs=self.max_num_active_reqs,
            token_budget=self.max_num_scheduled_tokens,
            num_kv_blocks_free=free,
            num_kv_blocks_total=pool.num_gpu_blocks,
            request_ids=tuple(r.request_id for r in self.running),
            draft_resident=self.draft_resident,
            kv_blocks_needed=self._kv_blocks_needed(free),
        )

    def _kv_blocks_needed(self, free: int) -> tuple[int, ...]:
        """``StepContext.kv_blocks_needed`` from the running decodes' KV as vLLM's KV cache manager holds it: every
        KV cache group allocates its own blocks from the one pool, with vLLM's lookahead slots beyond the step."""
        specs = [group.kv_cache_spec for group in self.kv_cache_config.kv_cache_groups]
        lookahead, max_k = self.num_lookahead_tokens, self.num_spec_tokens
        most = sum(most_kv_blocks_per_decode(spec.block_size, max_k, lookahead) for spec in specs)
        # Bounded by the running requests first: the usual step reads no request at all.
        if len(self.running) * most <= free:
            return ()
        decoding = [r for r in self.running if r.num_tokens - r.num_computed_tokens == 1]
        if len(decoding) * most <= free:
            return ()
        computed = [r.num_computed_tokens for r in decoding]
        drafts = [len(r.spec_token_ids) for r in decoding]
        held = [self.kv_cache_manager.get_block_ids(r.request_id) for r in decoding]
        per_group = [
            kv_blocks_needed(
                computed,
                [len(ids[group]) for ids in held],
                drafts,
                block_size=spec.block_size,
                max_k=max_k,
                lookahead_tokens=lookahead,
                max_model_len=self.max_model_len,
            )
            for group, spec in enumerate(specs)
        ]
        return tuple(sum(column) for column in zip(*per_group, strict=True))

    @property
    def draft_resident(self) -> bool:
        return self.elastic is None or self.elastic.resident

    def _batch_k(self, decision: Decision) -> int:
        """The decision's k within the engine's buffers (vLLM drafts the same k for every request)."""
        return max(0, min(decision.k, self.num_spec_tokens))

    def _truncate_drafts(self, k: int, caps: dict[str, int]) -> None:
        # Drafts proposed last step were sized by last step's k; verifying only k of them makes a
        # lower k take effect this step rather than the next (fast back-off when load spikes). A
        # per-request cap (AdaSpec's trimming, kld's per-sequence lengths) cuts that request's drafts the
        # same way: verifying a prefix of the drafts is lossless.
        lag_rule = self.tracks_draft_kv
        for request in self.running:
            limit = min(k, caps.get(request.request_id, k))
            if len(request.spec_token_ids) > limit:
                if limit < k:
                    self.counters.num_drafts_capped += 1
                request.spec_token_ids = request.spec_token_ids[:limit]
            if not lag_rule or not request.spec_token_ids:
                continue
            # The lag rule: drafts made on a draft KV cache with a hole would be verified at a lower
            # acceptance (lossless, but silently worse), so such a request drafts nothing until the draft
            # pass has caught it up (draft_sync.catch_up_plan).
            if self.draft_kv.lagging(request.request_id, request.num_computed_tokens):
                request.spec_token_ids = []
                self.counters.num_drafts_cut_for_lag += 1

    def _draft_signals(self, req_id: str, drafts: Sequence[int]) -> tuple[list[float], list[float]] | None:
        """The confidences and entropies of ``drafts``, a prefix of what the worker last drafted for ``req_id``."""
        kept = self._signals.get(req_id)
        if kept is None or len(drafts) > len(kept[1]) or list(drafts) != kept[0][: len(drafts)]:
            return None
        return kept[1][: len(drafts)], kept[2][: len(drafts)]

    def _verify_confident_prefix(self, stop: DraftStop) -> None:
        """Cut every request's drafts to the prefix the step's rule keeps (``confident_prefix``)."""
        with_drafts = [r for r in self.running if r.spec_token_ids]
        signals = [self._draft_signals(r.request_id, r.spec_token_ids) for r in with_drafts]
        confidences = [s[0] for s in signals if s is not None]
        if not confidences or len(confidences) < len(with_drafts):
            return  # a request without signals: the rule would read a batch it does not see
        keep = confident_prefix(stop, confidences)
        for request in with_drafts:
            if len(request.spec_token_ids) > keep:
                request.spec_token_ids = request.spec_token_ids[:keep]
                self.counters.num_drafts_cut_by_confidence += 1

    def _starts(self, out: SchedulerOutput) -> dict[str, int]:
        # vLLM advanced num_computed_tokens by the scheduled tokens in schedule(): each request's first position.
        return {
            req_id: self.requests[req_id].num_computed_tokens - n
            for req_id, n in out.num_scheduled_tokens.items()
            if req_id in self.requests
        }

    def _plan_draft_pass(self, out: SchedulerOutput) -> DraftPassPlan:
        """The step's draft pass, decided once: whether it runs and whom it catches up; every worker applies it."""
        skip = step_skips_draft_pass(self.skips_k0_draft_pass, out, self.draft_resident)
        if not self.tracks_draft_kv:
            return DraftPassPlan(skip=skip)
        if not skip:
            # A request entering the batch may start at a prefix-cache hit: its cached prefix counts as lag.
            self.draft_kv.forget(entering_request_ids(out))
        return plan_step(
            skip=skip,
            starts=self._starts(out),
            tracker=self.draft_kv,
            room=catch_up_room(self.scheduler_config.max_num_batched_tokens, out),
            max_tokens=self.catch_up_max_tokens,
        )

    def _track_draft_kv(self, plan: DraftPassPlan, starts: dict[str, int], result: ModelRunnerOutput) -> None:
        """After the step: the draft KV its pass wrote, by the plan the worker applied."""
        self.counters.num_requests_caught_up += len(plan.catch_up) - len(plan.partial)
        self.counters.num_catch_up_tokens += sum(plan.catch_up.values())
        sampled = result.sampled_token_ids
        steps = []
        for req_id, start in starts.items():
            request = self.requests.get(req_id)
            if request is None:  # finished this step
                continue
            index = result.req_id_to_index.get(req_id)
            produced = bool(sampled) and index is not None and bool(sampled[index])
            steps.append(ScheduledRequest(req_id, start, request.num_computed_tokens, produced))
        self.draft_kv.observe_step(plan.skip, steps, plan.catch_up)
        self.draft_kv.keep_only(self.requests)

    def _record(
        self, ctx: StepContext, out: SchedulerOutput, result: ModelRunnerOutput, skipped: bool, ended_s: float
    ) -> StepRecord:
        drafted: list[int] = []
        accepted: list[int] = []
        request_ids: list[str] = []
        confidences: list[tuple[float, ...]] = []
        entropies: list[tuple[float, ...]] = []
        sampled = result.sampled_token_ids
        invalid = out.num_invalid_spec_tokens or {}
        for req_id, draft_ids in out.scheduled_spec_decode_tokens.items():
            index = result.req_id_to_index.get(req_id)
            generated = sampled[index] if sampled and index is not None else []
            if not draft_ids or not generated:
                continue
            # Same counting as vLLM's SpecDecodingStats, so the totals agree with vllm:spec_decode_*.
            drafted.append(len(draft_ids) - invalid.get(req_id, 0))
            accepted.append(len(generated) - 1)
            request_ids.append(req_id)
            signals = self._draft_signals(req_id, draft_ids[: drafted[-1]])
            confidences.append(tuple(signals[0]) if signals else ())
            entropies.append(tuple(signals[1]) if signals else ())
        if not any(confidences):  # no signals this step: none rather than a tuple of empties
            confidences, entropies = [], []
        emitted = sum(len(tokens) for tokens in sampled) if sampled else 0
        k = out.num_spec_tokens_to_schedule
        forward_s, draft_s = step_timings(result) or (None, None)
        return StepRecord(
            now_s=ctx.now_s,
            k=k,
            duration_s=ended_s - self._step_started_s,
            num_running=len(out.num_scheduled_tokens),
            num_context_tokens=ctx.num_context_tokens,
            num_batched_tokens=out.total_num_scheduled_tokens,
            num_draft_passes=k if k > 0 else int(not skipped),
            num_emitted_tokens=emitted,
            num_drafted_per_request=tuple(drafted),
            num_accepted_per_request=tuple(accepted),
            request_ids=tuple(request_ids),
            draft_confidence_per_request=tuple(confidences),
            draft_entropy_per_request=tuple(entropies),
            forward_s=forward_s,
            draft_s=draft_s,
        )

    # -- run-time control (EngineCore utility methods below) --------------------------------------

    def set_policy(self, spec: str, warm_start: bool = True) -> str:
        policy = make_policy(spec, self.traits)  # raises ValueError naming the bad part
        # The new policy learns what this engine's steps cost and accept from the last ones it ran; without
        # ``warm_start`` it starts from its priors, as in a fresh engine (the simulator-vs-engine check's runs).
        steps = self.counters.num_steps
        history = self.counters.records_since(max(0, steps - WARM_START_STEPS)) if warm_start else ()
        self.policy.swap(policy, history)
        logger.info("specserve: policy set to %s", self.policy.spec)
        return self.policy.spec

    def check_counts(self, core: EngineCore) -> dict[str, int]:
        """The counters the start-up checks read (``startup_checks.CheckCounts``): this scheduler's and the first
        worker's (tensor-parallel ranks see the same steps)."""
        (worker,) = core.collective_rpc("specserve_draft_pass_counts")[:1]
        c = self.counters
        return {
            "num_steps": c.num_steps,
            "num_steps_draft_skipped": c.num_steps_draft_skipped,
            "num_draft_lists": c.num_draft_lists,
            "num_draft_lists_with_signals": c.num_draft_lists_with_signals,
            "num_passes_ran": worker["ran"],
            "num_passes_skipped": worker["skipped"],
            "num_proposals": worker["proposals"],
            "num_proposals_not_k": worker["proposals_not_k"],
        }

    def end_calibration(self, spec: str, failed_checks: Sequence[str], since_step: int = 0) -> str:
        """After the start-up calibration's dummy runs: serve under ``spec``, its cost model warm-started from the
        calibration's steps after ``since_step`` (its warm-up left out), their acceptance left out too (dummy prompts
        say nothing of real traffic's), and every counter and estimate starting from zero, as if those steps had never
        run. ``failed_checks`` stay in the telemetry."""
        history = [without_acceptance(r) for r in self.counters.records_since(since_step)]
        self.counters = StepCounters(max_k=self.num_spec_tokens)
        self.acceptance = PositionAcceptance(max_k=max(self.num_spec_tokens, 1))
        self.failed_checks = tuple(failed_checks)
        self.collapse = CollapseAction(self) if self.num_spec_tokens > 0 else None  # no baseline from dummy runs
        self.policy.swap(make_policy(spec, self.traits), history)
        logger.info(
            "specserve: calibrated on %d steps; policy %s%s",
            len(history),
            self.policy.spec,
            f"; failed start-up checks: {', '.join(failed_checks)}" if failed_checks else "",
        )
        return self.policy.spec

    def seed_acceptance(self, accepted: Sequence[float], reached: Sequence[float]) -> None:
        """Peers' acceptance evidence, for an engine that has verified no draft yet: the policy and the telemetry
        estimate start from it. Ignored once this engine has its own evidence, which says more about it."""
        if self.counters.num_reached_per_pos and self.counters.num_reached_per_pos[0] > 0:
            logger.info("specserve: acceptance prior ignored: this engine has verified drafts already")
            return
        self.acceptance.seed(accepted, reached)
        self.policy.seed_acceptance(accepted, reached)
        logger.info("specserve: acceptance prior %s", [round(a, 3) for a in self.acceptance.alphas()])

    def telemetry(self, since_step: int = 0) -> EngineTelemetry:
        """A pure read; ``since_step`` is the reader's cursor for step durations (see telemetry.py)."""
        pool = self.kv_cache_manager.block_pool
        return EngineTelemetry(
            policy=PolicySnapshot(
                spec=self.policy.spec,
                k=self.k,
                max_k=self.num_spec_tokens,
                info=self.policy.describe(),
                errors=dict(self.policy.errors),
                method=self.method.name,
                k0=self.k0_mode,
            ),
            load=LoadSnapshot(
                num_running=len(self.running),
                num_waiting=len(self.waiting),
                num_kv_blocks_total=pool.num_gpu_blocks,
                num_kv_blocks_free=pool.get_num_free_blocks(),
            ),
            speculation=self.counters.snapshot(),
            acceptance_ema=acceptance_estimate(self.acceptance, self.num_spec_tokens),
            step_durations_s=self.counters.durations_since(since_step),
            draft_memory=self.elastic.snapshot() if self.elastic is not None else None,
            failed_checks=self.failed_checks,
            collapse=self.collapse.snapshot() if self.collapse is not None else None,
        )
