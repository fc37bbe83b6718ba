"""A run: arrivals, a router (routing.py), and replicas stepping back to back in virtual time, driven by the event
loop (loop.py) in this process, or in several (parallel.py, ``workers`` > 1).

One ``Simulator`` per run, with its own event queue and RNG streams (house rule 9: no global simulator).
The seed fans out into independent streams (numpy SeedSequence.spawn): the workload and each request's
alpha come from streams no policy can touch, so every policy of a comparison sees the very same requests;
each replica draws its acceptance verdicts from its own stream and its draft-side signals from another
(signals.py), so turning signals on or off changes no verdict, and its step-time jitter from a third
(``StepTimer.jitter``). Streams are spawned in a fixed order (workload, alpha, verdicts per replica, signals per
replica, jitter per replica): adding the signal and jitter streams kept the others.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from specserve.sim.batch import Column, RequestTable
from specserve.sim.calibration import NOT_THE_ENGINE, planned_probes, probe_scenarios
from specserve.sim.config import ClientsArrivals, Scenario
from specserve.sim.draft_memory import DraftMemorySim
from specserve.sim.drafting import Drafter
from specserve.sim.feeds import ClosedLoop, OpenLoop
from specserve.sim.latency import StepTimer
from specserve.sim.loop import EventLoop, Feed, TraceEntry
from specserve.sim.oracle import Truth, build_policy
from specserve.sim.parallel import DEFAULT_SYNC_S, parallel_refusal, run_sharded, shards
from specserve.sim.proposer import Proposer
from specserve.sim.replica import Replica
from specserve.sim.routing import Router
from specserve.sim.scale_out import ScaleOut
from specserve.sim.scenario import ResolvedScenario, ScenarioError, resolve
from specserve.sim.signals import SignalModel
from specserve.sim.steps import StepListener
from specserve.sim.true_acceptance import TrueAcceptance
from specserve.sim.workload import Workload, build_workload
from specserve.speculation import EngineTraits, Policy, StepRecord
from specserve.speculation.types import without_acceptance

# Builds one replica's policy from the engine's traits: a caller's own constructor (tests pass policies that are
# not in the global registry this way). A spec string is built by ``oracle.build_policy``, which also knows the
# simulator-only policies and hands them the run's truth.
PolicyFactory = Callable[[EngineTraits], Policy]


@dataclass(slots=True)
class SimResult:
    """What a finished run leaves: the request table, the replicas (with their series) and timings."""

    resolved: ResolvedScenario
    policy_spec: str
    seed: int
    workload: Workload
    table: RequestTable
    replicas: list[Replica]
    end_s: float
    wall_s: float
    trace: list[TraceEntry] = field(default_factory=list)
    # Draft offload and reload, when the scenario enables it (memory.offload).
    memory: DraftMemorySim | None = None
    # The router, with its count of every route taken (routing.py).
    router: Router | None = None
    # A scale-out's prior: the pooled evidence each new replica was seeded with (None: none given).
    scale_out_prior: tuple[tuple[float, ...], tuple[float, ...], int] | None = None


def _without_truth(factory: PolicyFactory) -> Callable[[EngineTraits, Truth], Policy]:
    return lambda traits, _: factory(traits)


class Simulator:
    def __init__(
        self,
        resolved: ResolvedScenario,
        policy: str | PolicyFactory,
        seed: int,
        on_step: StepListener | None = None,
        max_trace_events: int = 0,
        workers: int = 1,
        sync_s: float = DEFAULT_SYNC_S,
    ) -> None:
        self.resolved = resolved
        # A spec string names the run; a factory's policies name it by their own spec once built.
        self.policy_spec = policy if isinstance(policy, str) else None
        self.build_policy: Callable[[EngineTraits, Truth], Policy] = (
            partial(build_policy, policy) if isinstance(policy, str) else _without_truth(policy)
        )
        self.seed = seed
        self.on_step = on_step
        self.max_trace_events = max_trace_events
        # Processes that step the replicas, whole nodes each (parallel.py); 1: the whole run in this process.
        self.workers, self.sync_s = workers, sync_s
        self._check_parallel(resolved)

    def run(self) -> SimResult:
        started = time.perf_counter()
        scenario, engine = self.resolved.scenario, self.resolved.scenario.engine
        num_replicas = scenario.num_replicas
        workload_rng, alpha_rng, *replica_rngs = (
            np.random.default_rng(s) for s in np.random.SeedSequence(self.seed).spawn(2 + 3 * num_replicas)
        )
        verdict_rngs, signal_rngs, jitter_rngs = (
            replica_rngs[i * num_replicas : (i + 1) * num_replicas] for i in range(3)
        )
        # Trace paths are absolute once load_scenario has read a file; a scenario built in code may use
        # paths relative to the working directory.
        acceptance = TrueAcceptance(scenario.acceptance, engine.max_k)
        feed: Feed
        if isinstance(scenario.workload.arrivals, ClientsArrivals):
            feed = ClosedLoop(
                scenario.workload, engine.max_model_len, acceptance, workload_rng, alpha_rng, self._check_fits
            )
        else:
            workload = build_workload(scenario.workload, Path.cwd(), engine.max_model_len, workload_rng)
            self._check_fits(workload)
            feed = OpenLoop(workload, RequestTable(workload, acceptance.draw_alphas(workload.arrival_s, alpha_rng)))
        table = feed.table
        # A lookup samples no logits: its drafts carry no confidence, entropy or KL (speculation.methods).
        with_signals = scenario.acceptance.signals.enabled and self.resolved.proposer.method.has_draft_logits
        signals = SignalModel(scenario.acceptance.signals) if with_signals else None
        proposer = self.resolved.proposer
        traits = EngineTraits(
            max_k=engine.max_k,
            k0_runs_draft_pass=proposer.k0_runs_pass,
            resume_s_per_token=_resume_s_per_token(proposer, self.resolved.timer),
            one_proposer_pass=proposer.one_pass,
            # Drafts made a step ahead (vLLM) are made before anything could ask to stop the loop.
            asks_stop_drafting=signals is not None and not engine.drafts_ahead,
            drafts_ahead=engine.drafts_ahead,
            batch_expansion=engine.scorer == "batch_expansion",
        )
        slo_tpot_s = scenario.slo.max_tpot_s if scenario.slo is not None else None
        history = startup_history(scenario) if engine.startup_calibration else ()
        replicas = []
        for i, (verdict_rng, signal_rng, jitter_rng) in enumerate(
            zip(verdict_rngs, signal_rngs, jitter_rngs, strict=True)
        ):
            truth = Truth(table, acceptance, self.resolved.timer)
            policy = self.build_policy(traits, truth)
            drafter = Drafter(acceptance, signals, verdict_rng, signal_rng)
            truth.replica = Replica(
                i,
                engine,
                self.resolved.num_kv_blocks,
                self.resolved.timer,
                policy,
                drafter,
                table,
                slo_tpot_s,
                self.on_step,
                jitter_rng,
                proposer,
            )
            truth.replica.guard.warm_start(history)
            replicas.append(truth.replica)
        memory = DraftMemorySim(scenario.memory, self.resolved, replicas) if scenario.memory.offload else None
        router = Router(scenario.router, Column(table, "batch"))
        scale_out = ScaleOut(scenario.scale_out, replicas) if scenario.scale_out is not None else None
        trace: list[TraceEntry] = []
        if self.workers > 1:
            assert isinstance(feed, OpenLoop)
            groups = shards(num_replicas, self.workers, scenario.memory.replicas_per_node)
            end_s = run_sharded(replicas, memory, router, feed, groups, self.sync_s)
        else:
            end_s = self._loop(feed, replicas, router, trace, memory, scale_out)
        feed.finish()
        spec = self.policy_spec or replicas[0].policy.spec
        wall_s = time.perf_counter() - started
        prior = scale_out.prior if scale_out is not None else None
        return SimResult(
            self.resolved, spec, self.seed, feed.workload, table, replicas, end_s, wall_s, trace, memory, router, prior
        )

    def _loop(
        self,
        feed: Feed,
        replicas: list[Replica],
        router: Router,
        trace: list[TraceEntry],
        memory: DraftMemorySim | None,
        scale_out: ScaleOut | None,
    ) -> float:
        loop = EventLoop(replicas, memory, router, feed, scale_out, trace, self.max_trace_events)
        loop.run()
        return loop.end_s

    def _check_parallel(self, resolved: ResolvedScenario) -> None:
        """What a parallel run cannot do, refused before anything runs."""
        listens = self.on_step is not None or self.max_trace_events > 0
        problem = parallel_refusal(resolved.scenario, self.workers, self.sync_s, listens)
        if problem is not None:
            raise ScenarioError(f"scenario {resolved.scenario.name!r}: {problem}")

    def _check_fits(self, workload: Workload) -> None:
        # A request longer than the whole KV cache would preempt itself forever; vLLM refuses such a
        # max_model_len at start-up, and so do we.
        engine = self.resolved.scenario.engine
        capacity = self.resolved.num_kv_blocks * engine.block_size
        longest = int((workload.prompt_tokens + workload.output_tokens).max(initial=0)) + engine.max_k
        if longest > capacity:
            raise ScenarioError(
                f"scenario {self.resolved.scenario.name!r}: a request of {longest} tokens (with max_k lookahead) "
                f"exceeds the KV cache of {capacity} tokens; lower engine.max_model_len or raise engine.num_kv_blocks"
            )
        if not engine.enable_chunked_prefill and longest - engine.max_k > engine.max_num_batched_tokens:
            raise ScenarioError(
                f"scenario {self.resolved.scenario.name!r}: without chunked prefill a request of "
                f"{longest - engine.max_k} "
                f"tokens never fits engine.max_num_batched_tokens={engine.max_num_batched_tokens}"
            )


def _resume_s_per_token(proposer: Proposer, timer: StepTimer) -> float | None:
    """``EngineTraits.resume_s_per_token``: None where k = 0 runs the proposer's pass, 0 where a skipped step leaves
    nothing to catch up (a lookup), else what the draft's catch-up costs per token."""
    if proposer.k0_runs_pass:
        return None
    return _draft_s_per_token(timer) if proposer.catches_up else 0.0


def _draft_s_per_token(timer: StepTimer) -> float:
    """The draft's marginal seconds per token in one forward: what a catch-up token costs the engine."""
    return (timer.draft.forward_s(0.0, 1025.0) - timer.draft.forward_s(0.0, 1.0)) / 1024.0


# Calibrations made in this process, by the engine's description and the plan: every run of one engine, whatever
# its traffic, policy or seed, starts from the same calibration, so a sweep makes it once. A memo of a pure
# function's results.
_HISTORIES: dict[str, tuple[StepRecord, ...]] = {}
_MAX_HISTORIES = 64


def startup_history(scenario: Scenario) -> tuple[StepRecord, ...]:
    """The steps of ``scenario``'s engine's start-up calibration (calibration.py), in the plan's order, costs only:
    what each of its replicas' policies is warm-started from."""
    probes = planned_probes(scenario.engine)
    key = f"{scenario.model_dump_json(exclude=NOT_THE_ENGINE | {'name', 'description'})} {probes}"
    history = _HISTORIES.get(key)
    if history is None:
        records: list[StepRecord] = []
        for probe, probe_scenario in probe_scenarios(scenario, probes):
            Simulator(resolve(probe_scenario), f"fixed:k={probe.k}", 0, lambda r, _: records.append(r)).run()
        history = tuple(without_acceptance(r) for r in records)
        if len(_HISTORIES) >= _MAX_HISTORIES:
            _HISTORIES.clear()
        _HISTORIES[key] = history
    return history
