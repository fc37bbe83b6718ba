"""The simulator against the real engine on one replayed load (``bench/engine_check.py`` runs it).

1. A load is replayed into a real vLLM engine (a ``CheckSetup``'s pair, CPU, in this process), greedy,
   ``ignore_eos``, and the engine runs the policy under test. The load is either a trace (the simulator's CSV
   format: each request is added when its arrival time has passed) or a closed loop of clients by phase
   (each client sends again the moment it is answered). Below its capacity an open trace's throughput is the
   arrivals' rate whatever the step times; a closed loop's is set by the engine's speed alone, so it tests the
   fitted step times and the simulator's batching where a trace cannot. The engine's own step log
   (``lab.harness.replay``) records every step: k, batch, context, batched tokens, draft passes, duration.
2. A CPU step-time model is fitted to that log (``fit_cpu_timer``): TurboSpec Eq. 3 for the target and for
   one draft pass plus a fixed per-step cost and a fixed cost per speculating step, by non-negative least
   squares on relative error, on each busy step's start-to-start wall time (``busy_step_times``), which
   includes the loop's work between steps. Where the engine timed each step's target pass and draft passes,
   each part is fitted on its own time. The fit is then scaled so that the log's steps take as long in it as
   on the engine (relative-error least squares fits the typical step, below the mean where slow steps form a
   tail), and their spread around it becomes the simulator's per-step jitter, of mean 1.
3. The simulator replays the same trace with that timer, the engine's measured acceptance (position 0's rate,
   and the deeper rates as a spread of requests' alphas or a decay: ``acceptance_from``) and the same policy,
   its draft re-reading every scheduled token in its first pass as vLLM's draft-model proposer does.
4. Both runs are compared on output throughput (over the trace's span; a closed loop's over its phases, the
   drain after them left out, as ``specserve bench`` rates it) and per time window on throughput and mean k.

A policy that chooses k runs on the engine several times (``bench/engine_check.py --rounds``), each run from the
policy's priors as the simulator's runs start: its k over time is a draw, as the simulator's is (acceptance
verdicts, step-time spread), and two k of near-equal worth can be chosen in one run and not in the next. So the
engine's side of the comparison is the mean over its runs, as the simulator's is the mean over its seeds; the
report gives each run's own error beside it.

What is fitted and what is compared are not the same numbers: the fit sees step times, the comparison is of
throughput and of the k the policy chose, which the simulator derives from its own queueing, batching and
acceptance draws. Agreement within 10 % is the bar.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from lab.experiments.gpu_fit import nonneg_lstsq
from specserve.sim.config import (
    AcceptanceConfig,
    ClientPhase,
    ClientsArrivals,
    EngineConfig,
    LatencyConfig,
    LengthsConfig,
    Scenario,
    SignalsConfig,
    TraceArrivals,
    WorkloadConfig,
)
from specserve.sim.latency import LinearForward, StepTimer
from specserve.sim.profiles import LengthDistribution
from specserve.sim.workload import clients_at
from specserve.speculation.draft_sync import CPU_CATCH_UP_MAX_TOKENS
from specserve.speculation.estimators.acceptance import expected_tokens

PROMPT_TOKENS, OUTPUT_TOKENS = 32, 64
WINDOW_S = 5.0
# Simulator seeds per policy: the engine ran once, the simulator's acceptance verdicts and step-time jitter are
# drawn, so its k per window is averaged over these.
SIM_SEEDS = 5
MAX_NUM_SEQS = 8


@dataclass(frozen=True, slots=True)
class CheckSetup:
    """A pair the check runs on, and a low -> high -> low load for it: a trace of seconds at each rate (QPS),
    the middle segment offering more than 8 seats serve, so that the batch fills and a queue builds; or, where
    ``phases`` is set, a closed loop of (clients, seconds) phases instead."""

    name: str  # bench/engine_check.py's --pair
    description: str
    pair_kind: str  # models.cached_pair's kind and options
    pair_options: tuple[tuple[str, Any], ...]
    sim_pair: str  # the simulator's pair profile (shapes only: the check fits its own step times)
    segments: tuple[tuple[float, float], ...]
    # The trace stretched for a slower machine: each segment this many times longer at this many times the rate
    # below, so that the load relative to what the engine serves keeps its shape. A closed loop's phases are
    # only made longer: its clients already wait for the engine.
    slowdown: float = 1.0
    phases: tuple[tuple[int, float], ...] = ()

    def slowed(self, factor: float) -> CheckSetup:
        """This setup's load for a machine ``factor`` times slower than the one it was sized on."""
        if not factor > 0:
            raise ValueError(f"slowdown {factor}: must be positive")
        segments = tuple((d * factor, r / factor) for d, r in self.segments)
        phases = tuple((c, d * factor) for c, d in self.phases)
        return dataclasses.replace(self, segments=segments, phases=phases, slowdown=self.slowdown * factor)

    @property
    def closed(self) -> bool:
        return bool(self.phases)

    @property
    def horizon_s(self) -> float:
        """The load's length: the trace's segments or the closed loop's phases."""
        return sum(d for _, d in self.phases) if self.closed else sum(d for d, _ in self.segments)

    def client_phases(self) -> list[ClientPhase]:
        return [ClientPhase(clients=c, duration_s=d) for c, d in self.phases]

    def schedule(self) -> Callable[[float], tuple[int, float]]:
        """The closed loop's clients ``t_s`` seconds in and when that next changes (``lab.harness.replay`` asks
        between every two steps, so the phases are built once here)."""
        phases = self.client_phases()
        return lambda t_s: clients_at(phases, t_s)

    def trace_file(self, directory: Path) -> Path | None:
        """Where the setup's trace lives beside its results; a closed loop has none."""
        return None if self.closed else directory / f"{self.prefix}-trace.csv"

    @property
    def prefix(self) -> str:
        """The result files' common name: engine-check for the first pair the check ran on."""
        return "engine-check" if self.name == "trained" else f"engine-check-{self.name}"


SETUPS = {
    # Serves a request alone in about a tenth of a second; speculation barely matters to its cost.
    "trained": CheckSetup(
        "trained", "the tiny trained pair", "trained", (), "tiny-trained", ((15.0, 1.0), (15.0, 40.0), (15.0, 1.0))
    ),
    # About a second per request alone (bf16 on a CPU with AMX), where k = 2 is the best fixed k; k = 0-1 at a full
    # batch. In float32 on an AVX2-only CPU a request alone takes about 6.5 s: --slowdown 6 there.
    "perf-S": CheckSetup(
        "perf-S",
        "perf pair S at agreement 0.6",
        "perf",
        (("size", "S"), ("agreement", 0.6)),
        "perf-S",
        ((15.0, 0.5), (15.0, 6.0), (15.0, 0.5)),
    ),
    # The same pair under a closed loop, 1 -> 8 -> 1 clients: alone k = 3-4 serve best and k = 0 at 0.6 x them, at a
    # full batch of 8 k = 0 and 2 tie and k = 4 serves 0.84 x them (the engine's steps, bf16 on an AVX-512 CPU).
    "perf-S-clients": CheckSetup(
        "perf-S-clients",
        "perf pair S at agreement 0.6, a closed loop",
        "perf",
        (("size", "S"), ("agreement", 0.6)),
        "perf-S",
        (),
        phases=((1, 20.0), (8, 20.0), (1, 20.0)),
    ),
}
SEGMENTS = SETUPS["trained"].segments


@dataclass(frozen=True, slots=True)
class TraceRow:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class RunSummary:
    throughput_tok_s: float
    makespan_s: float
    # Mean k of the steps that started in each WINDOW_S window (nan where none ran).
    k_by_window: tuple[float, ...]
    # Mean arrival-to-last-token seconds: what the throughput of an arrival-bound trace cannot show.
    mean_e2e_s: float = float("nan")
    # Per window, the mean batch (running requests) and context tokens of its decode steps (engine runs only).
    batch_by_window: tuple[float, ...] = ()
    context_by_window: tuple[float, ...] = ()
    # Output tokens per second emitted by the steps that started in each window.
    rate_by_window: tuple[float, ...] = ()


def make_trace(seed: int, segments: Sequence[tuple[float, float]] = SEGMENTS) -> list[TraceRow]:
    """Poisson arrivals over ``segments``, fixed lengths (the comparison is of scheduling, not of length draws)."""
    rng = np.random.default_rng(seed)
    rows, start = [], 0.0
    for duration_s, rate in segments:
        t = start + rng.exponential(1.0 / rate)
        while t < start + duration_s:
            rows.append(TraceRow(round(t, 4), PROMPT_TOKENS, OUTPUT_TOKENS))
            t += rng.exponential(1.0 / rate)
        start += duration_s
    return rows


def write_trace(rows: Sequence[TraceRow], path: Path) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["arrival_s", "prompt_tokens", "output_tokens"])
        for r in rows:
            writer.writerow([r.arrival_s, r.prompt_tokens, r.output_tokens])
    return path


def run_order(policies: Sequence[str], rounds: int, closed: bool = False) -> list[str]:
    """The engine's runs: every policy in the first round, the ones that choose k again in each later round (a
    fixed k's runs cannot differ in k, and on a trace its throughput is the arrivals'). Under a closed loop
    (``closed``) every policy runs in every round: there a fixed k's throughput is the engine's speed, which
    moves from run to run as much as a chosen k does."""
    again = policies if closed else [p for p in policies if not p.startswith("fixed:")]
    return [*policies, *list(again) * (rounds - 1)]


def busy_step_times(log: Sequence[dict]) -> list[dict]:
    """Each step's wall time start to next start, where the engine went straight on to the next step.

    Back to back, start-to-start is the time a step really costs the trace, the loop's work between steps
    (output processing, detokenizing, the client adding requests) included. The engine's own record times a
    busy step from the previous step's end, the same span shifted by one gap; start-to-start also lets the fit
    drop the steps followed by an idle gap or by a pause of the replay itself (collecting the step log)."""
    out = []
    for e, nxt in zip(log, log[1:], strict=False):
        wall = nxt["now_s"] - e["now_s"]
        if wall <= 2.0 * e["duration_s"] + 0.005:
            out.append({**e, "duration_s": wall})
    return out


class CpuFit(NamedTuple):
    """``fit_cpu_timer``'s answer: the timer, its median relative error over the log's whole steps, whether it
    was fitted part by part or on whole steps, and whether every step had timed its target pass and draft passes
    (the parts could have been fitted)."""

    timer: StepTimer
    error: float
    on_parts: bool
    parts_timed: bool


def _draft_columns(e: dict) -> list[float]:
    """A step's draft regressors: its passes, their context reads, and the tokens they process. The draft's first
    pass reads the step's batched tokens, each further pass one token per request."""
    passes = e["num_draft_passes"]
    draft_tokens = (e["num_batched_tokens"] if passes else 0) + max(passes - 1, 0) * e["num_running"]
    return [passes, passes * e["num_context_tokens"], draft_tokens]


def _timer(
    target: Sequence[float], draft: Sequence[float], overhead: float, speculation: float, scale: float = 1.0
) -> StepTimer:
    """A fitted timer, every coefficient times ``scale``; each forward's as (per context token, per batched token,
    per pass)."""
    return StepTimer(
        target=LinearForward(*(scale * float(v) for v in target)),
        draft=LinearForward(*(scale * float(v) for v in draft)),
        step_overhead_s=scale * float(overhead),
        speculation_overhead_s=scale * float(speculation),
    )


def _step_shape(e: dict) -> tuple[float, float, list[float]]:
    """A logged step as ``StepTimer.step_s`` takes it: context, batched tokens, and each draft pass's tokens."""
    passes = e["num_draft_passes"]
    first = [float(e["num_batched_tokens"])] if passes else []
    return e["num_context_tokens"], e["num_batched_tokens"], first + [float(e["num_running"])] * max(passes - 1, 0)


def fit_cpu_timer(log: Sequence[dict], use_parts: bool = True) -> CpuFit:
    """Step time = overhead + target(context, batched) + per draft pass (fixed + context) + draft tokens
    + a fixed cost for a step that speculates (k > 0 and the draft ran).

    Where every step timed its parts (``forward_s``, ``draft_s``: the engine's worker times them), each part is
    fitted on its own: the target's pass on its context and batched tokens, the draft's passes on theirs, and the
    rest of the step (the start-to-start time less both) on a fixed cost and the speculating step's. Whole steps
    cannot separate a cost that grows with k from one that grows with the batch while k holds still; the parts
    can, at any k. A log without parts (an older one) is fitted whole, as before: without the speculating step's
    fixed cost that fit spreads it over the passes and prices k = 4 above k = 2 where the engine measured the
    opposite. Both fits are non-negative least squares on relative error. ``use_parts=False`` fits whole steps
    even where the parts were timed (an A/B of the two fits on one log)."""
    wall = np.array([e["duration_s"] for e in log], dtype=float)
    weights = 1.0 / wall
    speculates = [float(e["k"] > 0 and e["num_draft_passes"] > 0) for e in log]
    parts_timed = bool(log) and all(e.get("forward_s") is not None and e.get("draft_s") is not None for e in log)
    on_parts = use_parts and parts_timed
    if on_parts:
        forward = np.array([e["forward_s"] for e in log], dtype=float)
        draft = np.array([e["draft_s"] for e in log], dtype=float)
        t = nonneg_lstsq(
            np.array([[e["num_context_tokens"], e["num_batched_tokens"], 1.0] for e in log]), forward, weights
        )
        d = nonneg_lstsq(np.array([_draft_columns(e) for e in log], dtype=float), draft, weights)
        r = nonneg_lstsq(np.array([[1.0, s] for s in speculates]), wall - forward - draft, weights)
        coefficients = ((t[0], t[1], t[2]), (d[1], d[2], d[0]), r[0], r[1])
    else:
        x = [
            [1.0, e["num_context_tokens"], e["num_batched_tokens"], *_draft_columns(e), s]
            for e, s in zip(log, speculates, strict=True)
        ]
        c = nonneg_lstsq(np.array(x, dtype=float), wall, weights)
        coefficients = ((c[1], c[2], 0.0), (c[4], c[5], c[3]), c[0], c[6])

    # Relative-error least squares fits the typical step. Where slow steps form a long tail (a CPU shared with the
    # serving path) the typical step is below the mean one, and the simulator's jitter has mean 1 around the fit:
    # on one machine the fit priced one-request steps 12 % under their mean and the simulator served 1.06-1.16 x
    # the engine's tokens per second. So the fit is scaled until the log's steps take as long in it as on the
    # engine: its shape is the least-squares one, its level the engine's total time.
    fitted = _timer(*coefficients)
    shapes = zip(log, speculates, strict=True)
    unscaled = np.array([fitted.step_s(*_step_shape(e), verifies=bool(s)) for e, s in shapes])
    level = float(wall.sum() / unscaled.sum()) if unscaled.sum() > 0 else 1.0
    timer = _timer(*coefficients, scale=level)
    predicted = level * unscaled
    # What the linear model leaves unexplained, as the simulator's per-step noise: same-shaped steps on this
    # machine spread widely, and a policy that learns step costs online sees that spread.
    timer = dataclasses.replace(timer, jitter_sigma=float(np.std(np.log(wall / np.maximum(predicted, 1e-9)))))
    return CpuFit(timer, float(np.median(np.abs(predicted / wall - 1.0))), on_parts, parts_timed)


# Beta concentrations acceptance_from tries: 0.5 (alphas spread widely) to about 2000 (nearly alike).
CONCENTRATIONS = tuple(float(c) for c in np.geomspace(0.5, 2048, 97))


def acceptance_from(per_pos_reached: Sequence[int], per_pos_accepted: Sequence[int]) -> AcceptanceConfig:
    """The simulator's per-request acceptance from the engine's conditional rates per position (accepted /
    reached): alpha at position 0, and what the deeper rates say.

    Rates that rise with the position are survivor bias: a draft that reached position j came from a request
    whose earlier drafts were accepted, so the easier requests are over-represented there. Requests' alphas
    spread as Beta(mean c, (1 - mean) c) give exactly that rise, E[a^(j+1)] / E[a^j] = (mean c + j) / (c + j),
    so c is fitted to the rates (weighted by the drafts that reached each position). Rates that fall are a
    geometric decay, every request alike."""
    pairs = [(a / d, d) for a, d in zip(per_pos_accepted, per_pos_reached, strict=True) if d > 0]
    if not pairs:
        return AcceptanceConfig(mean=0.5, concentration=None)
    mean = min(pairs[0][0], 1.0)
    if len(pairs) == 1 or mean in (0.0, 1.0):
        return AcceptanceConfig(mean=mean, concentration=None)
    if pairs[-1][0] < pairs[0][0]:
        decay = (pairs[-1][0] / pairs[0][0]) ** (1.0 / (len(pairs) - 1))
        return AcceptanceConfig(mean=mean, concentration=None, decay=max(decay, 1e-3))

    def misfit(c: float) -> float:
        return sum(
            d * (beta - rate) ** 2 for beta, (rate, d) in zip(_beta_rates(mean, c, len(pairs)), pairs, strict=True)
        )

    concentration = min(CONCENTRATIONS, key=misfit)
    flat = sum(d * (mean - rate) ** 2 for rate, d in pairs)  # every request alike: no rise at all
    return AcceptanceConfig(mean=mean, concentration=concentration if misfit(concentration) < flat else None)


def simulate_trace(
    trace: Path | None,
    timer: StepTimer,
    acceptance: AcceptanceConfig,
    policy: str,
    max_k: int,
    setup: CheckSetup,
    seed: int = 0,
) -> tuple:
    """The simulator's run of the trace (``None``: of the setup's closed loop) with the fitted timer; returns
    (step log rows, makespan, result)."""
    from specserve.sim.kernel import Simulator
    from specserve.sim.scenario import resolve

    if trace is None:
        prompt, output = (LengthDistribution(mean=n, std=0, max_tokens=n) for n in (PROMPT_TOKENS, OUTPUT_TOKENS))
        workload = WorkloadConfig(
            lengths=LengthsConfig(prompt_tokens=prompt, output_tokens=output),
            arrivals=ClientsArrivals(kind="clients", phases=setup.client_phases()),
        )
    else:
        workload = WorkloadConfig(arrivals=TraceArrivals(kind="trace", path=str(trace.resolve())))
    scenario = Scenario(
        name="engine-check",
        hardware="cpu-2core",
        pair=setup.sim_pair,
        engine=EngineConfig(
            max_num_seqs=MAX_NUM_SEQS,
            max_k=max_k,
            k0_runs_draft_pass=False,
            draft_first_pass="scheduled",
            drafts_ahead=True,
            catch_up_max_tokens=CPU_CATCH_UP_MAX_TOKENS,  # the CPU engine's cap (k0_skip.catch_up_cap)
            num_kv_blocks=4096,
            max_model_len=512,
        ),
        latency=LatencyConfig(),
        workload=workload,
        # The engine's draft signals only cut drafts before verification (on the perf pair the calibrated rule cut
        # almost none, lab/studies/confident_prefix/confident_prefix.py); the simulator's draft loop would use them
        # to stop passes, a
        # mechanism the engine does not have, so this run keeps them off.
        acceptance=acceptance.model_copy(update={"signals": SignalsConfig(enabled=False)}),
    )
    steps: list[dict] = []

    def on_step(record: Any, _stats: Any) -> None:
        steps.append({"now_s": record.now_s, "k": record.k, "num_emitted_tokens": record.num_emitted_tokens})

    resolved = dataclasses.replace(resolve(scenario), timer=timer)
    result = Simulator(resolved, policy, seed, on_step).run()
    for entry in steps:
        entry["t_s"] = entry["now_s"] - (steps[0]["now_s"] if steps else 0.0)
    return steps, float(result.table.finish_s.max() - result.table.arrival_s.min()), result


def sim_e2e(result: Any) -> list[float]:
    return list(result.table.finish_s - result.table.arrival_s)


def summarize_run(
    steps: Sequence[dict],
    makespan_s: float,
    horizon_s: float,
    e2e_s: Sequence[float] = (),
    closed: bool = False,
    runs: int = 1,
) -> RunSummary:
    """``steps`` of ``runs`` runs pooled (``makespan_s`` their sum). A closed loop (``closed``) is rated on the
    tokens of the steps that started within ``horizon_s``, as ``specserve bench`` rates one; a trace on all its
    tokens over the makespan."""
    within = [e for e in steps if e["t_s"] < horizon_s] if closed else steps
    tokens = sum(e["num_emitted_tokens"] for e in within)
    windows, batches, contexts, rates = [], [], [], []
    for w in range(math.ceil(horizon_s / WINDOW_S)):
        mine = [e for e in steps if w * WINDOW_S <= e["t_s"] < (w + 1) * WINDOW_S]
        windows.append(statistics.mean(e["k"] for e in mine) if mine else float("nan"))
        decodes = [e for e in mine if e.get("num_running", 0) > 0]
        batches.append(statistics.mean(e["num_running"] for e in decodes) if decodes else float("nan"))
        contexts.append(statistics.mean(e["num_context_tokens"] for e in decodes) if decodes else float("nan"))
        rates.append(sum(e["num_emitted_tokens"] for e in mine) / (WINDOW_S * runs))
    return RunSummary(
        tokens / (horizon_s * runs) if closed else tokens / makespan_s,
        makespan_s,
        tuple(windows),
        statistics.mean(e2e_s) if e2e_s else float("nan"),
        tuple(batches),
        tuple(contexts),
        tuple(rates),
    )


def _nanmean_columns(rows: Sequence[Sequence[float]]) -> tuple[float, ...]:
    out = []
    for w in range(max((len(r) for r in rows), default=0)):
        values = [r[w] for r in rows if w < len(r) and not math.isnan(r[w])]
        out.append(statistics.mean(values) if values else float("nan"))
    return tuple(out)


def mean_summary(runs: Sequence[RunSummary], e2e_s: Sequence[float] = ()) -> RunSummary:
    """Several engine runs of one policy as one: mean throughput and makespan, per window the mean over the runs
    that ran steps in it, and the mean of every request's end-to-end time (``e2e_s``, pooled over the runs)."""
    return RunSummary(
        statistics.mean(r.throughput_tok_s for r in runs),
        statistics.mean(r.makespan_s for r in runs),
        _nanmean_columns([r.k_by_window for r in runs]),
        statistics.mean(e2e_s) if e2e_s else float("nan"),
        _nanmean_columns([r.batch_by_window for r in runs]),
        _nanmean_columns([r.context_by_window for r in runs]),
        _nanmean_columns([r.rate_by_window for r in runs]),
    )


def conditional_rates(acceptance: AcceptanceConfig, positions: int) -> list[float]:
    """The acceptance rate at each draft position given the ones before it, as the simulator draws it: a Beta
    spread of requests' alphas raises it with the position, a decay lowers it."""
    if acceptance.concentration is not None:
        return _beta_rates(acceptance.mean, acceptance.concentration, positions)
    return [acceptance.mean * acceptance.decay**j for j in range(positions)]


def _beta_rates(mean: float, concentration: float, positions: int) -> list[float]:
    """Conditional rates E[a^(j+1)] / E[a^j] = (mean c + j) / (c + j) of alphas spread as Beta(mean c, (1 - mean) c)."""
    return [(mean * concentration + j) / (concentration + j) for j in range(positions)]


def k_worth(timer: StepTimer, acceptance: AcceptanceConfig, k: float, batch: float, context: float) -> float:
    """Tokens per second of a decode step at ``k`` (a mean k interpolates between its two neighbours) for
    ``batch`` requests over ``context`` tokens, priced by the fitted timer and acceptance: what a window's k is
    worth, so that two k can be told apart by what they serve rather than by their distance."""
    low = math.floor(k)
    if k > low:
        return (low + 1 - k) * k_worth(timer, acceptance, low, batch, context) + (k - low) * k_worth(
            timer, acceptance, low + 1, batch, context
        )
    tokens = expected_tokens(conditional_rates(acceptance, low), low)
    batched = batch * (low + 1)
    passes = [batched] + [batch] * (low - 1) if low else []  # the first pass re-reads the scheduled tokens
    return batch * tokens / timer.step_s(context, batched, passes, verifies=low > 0)


def worth_ratios(check: PolicyCheck, timer: StepTimer) -> list[float]:
    """Per window where both ran steps: the simulator's mean k's worth over the engine's, at the engine's batch
    and context in that window (``k_worth``)."""
    out = []
    for e, s, b, c in zip(
        check.engine.k_by_window,
        check.sim.k_by_window,
        check.engine.batch_by_window,
        check.engine.context_by_window,
        strict=False,
    ):
        if not any(math.isnan(v) for v in (e, s, b, c)):
            out.append(k_worth(timer, check.acceptance, s, b, c) / k_worth(timer, check.acceptance, e, b, c))
    return out


def rate_errors(engine: RunSummary, sim: RunSummary) -> list[float]:
    """Per window in which the engine emitted tokens: |sim rate / engine rate - 1|."""
    return [abs(s / e - 1.0) for e, s in zip(engine.rate_by_window, sim.rate_by_window, strict=False) if e > 0]


def k_errors(engine: RunSummary, sim: RunSummary) -> list[float]:
    """Per window where both ran steps: |sim k - engine k| / max(engine k, 1)."""
    return [
        abs(s - e) / max(e, 1.0)
        for e, s in zip(engine.k_by_window, sim.k_by_window, strict=False)
        if not (math.isnan(e) or math.isnan(s))
    ]


@dataclass(frozen=True, slots=True)
class PolicyCheck:
    policy: str
    engine: RunSummary  # the mean of engine_runs
    sim: RunSummary
    acceptance: AcceptanceConfig
    engine_runs: tuple[RunSummary, ...] = ()
    sim_seeds: int = SIM_SEEDS  # the simulator's runs behind ``sim``

    @property
    def e2e_ratio(self) -> float:
        return self.sim.mean_e2e_s / self.engine.mean_e2e_s

    @property
    def throughput_ratio(self) -> float:
        return self.sim.throughput_tok_s / self.engine.throughput_tok_s

    def k_errors(self) -> list[float]:
        """Per window, the engine's runs' mean k against the simulator's seeds' mean k (``k_errors``)."""
        return k_errors(self.engine, self.sim)

    def rate_errors(self) -> list[float]:
        """Per window, the engine's runs' mean throughput against the simulator's seeds' (``rate_errors``)."""
        return rate_errors(self.engine, self.sim)

    def k_error_each_run(self) -> list[float]:
        """Each engine run alone against the simulator's mean: its windows' mean error."""
        return [statistics.mean(e) if (e := k_errors(run, self.sim)) else float("nan") for run in self.engine_runs]


@dataclass(frozen=True, slots=True)
class EngineRun:
    """One policy's replay on the real engine (``lab.harness.replay``)."""

    policy: str
    steps: list[dict]
    makespan_s: float
    e2e_s: list[float]
    # Per draft position, reached and accepted drafts over the run: conditional acceptance.
    reached_per_pos: list[int]
    accepted_per_pos: list[int]


def compare(
    runs: Sequence[EngineRun],
    trace: Path | None,
    max_k: int,
    setup: CheckSetup,
    sim_seeds: int = SIM_SEEDS,
    use_parts: bool = True,
) -> tuple[list[PolicyCheck], CpuFit]:
    """One timer fitted to all the runs' busy steps, then the simulator's replay of each policy (of ``trace``, or
    of the setup's closed loop where it is ``None``), over ``sim_seeds`` seeds (acceptance verdicts and step-time
    jitter), against the mean of the engine's runs of it (policies in the order of their first run). Returns the
    checks and the fit."""
    horizon, closed = setup.horizon_s, setup.closed
    fit = fit_cpu_timer([e for run in runs for e in busy_step_times(run.steps)], use_parts)
    timer = fit.timer
    reached = [sum(col) for col in zip(*(r.reached_per_pos for r in runs), strict=True)]
    accepted = [sum(col) for col in zip(*(r.accepted_per_pos for r in runs), strict=True)]
    acceptance = acceptance_from(reached, accepted)
    by_policy: dict[str, list[EngineRun]] = {}
    for run in runs:
        by_policy.setdefault(run.policy, []).append(run)
    checks = []
    for policy, mine in by_policy.items():
        sims = [simulate_trace(trace, timer, acceptance, policy, max_k, setup, seed) for seed in range(sim_seeds)]
        # The seeds' steps pooled: k per window and tokens over the mean makespan are their averages.
        sim_steps = [step for steps, _, _ in sims for step in steps]
        total_makespan = sum(makespan for _, makespan, _ in sims)
        sim_e2e_s = [e for _, _, r in sims for e in sim_e2e(r)]
        sim = summarize_run(sim_steps, total_makespan, horizon, sim_e2e_s, closed, len(sims))
        sim = dataclasses.replace(sim, makespan_s=total_makespan / len(sims))
        each = tuple(summarize_run(r.steps, r.makespan_s, horizon, r.e2e_s, closed) for r in mine)
        engine = mean_summary(each, [e for r in mine for e in r.e2e_s])
        checks.append(PolicyCheck(policy, engine, sim, acceptance, each, sim_seeds))
    return checks, fit
