"""One policy against the whole zoo, judged by what users feel: the bar the project set for ``adaptive``.

Below saturation an open-loop run's throughput is its offered load whatever the policy, so throughput says
little there; latency is where a policy shows. At every static rate each cell therefore compares:

- mean and p99 end-to-end latency and mean and p99 TPOT, each against the best rival on that metric;
- throughput, only where it separates policies: the cell is **saturated** (the engine had requests it could not
  schedule, left waiting or preempted, for at least ``SATURATED_SHARE`` of the arrival window under the median
  policy) or an **offline** batch (every request arrives at once, so throughput is the time to serve them);
- SLO goodput (output tokens of requests meeting the scenario's SLO per second), where the scenario sets an SLO;
- the distance to the ``oracle`` (specserve/sim/oracle.py), which knows each request's true acceptance and the
  true step cost and is no rival: no deployable policy has that knowledge.

A static cell: a Poisson or trace scenario is one; a piecewise, burst, oscillation or multi-peak scenario
contributes one per distinct positive rate, each run as its own Poisson scenario over ``static_window_s`` (the
same hardware, pair, lengths and acceptance).

The bar:
- **latency**: at every static cell, mean E2E at most ``E2E_BAR`` x and p99 E2E at most ``P99_BAR`` x the best
  rival's;
- **oracle**: goodput (throughput where no SLO is set) at least ``ORACLE_BAR`` x the oracle's, on average over the
  static cells;
- **throughput**: at least ``THROUGHPUT_BAR`` x the best rival's in the saturated and offline cells;
- **dynamic rates**: on the scenarios whose rate changes, the best mean over scenarios of throughput relative to
  each scenario's best rival-or-ours (the whole run, drain included, so a policy that falls behind pays);
- **switching**: fewer k switches than ``bandit`` on every scenario.

Rivals are every other policy of the zoo with its paper defaults, plus fixed k = 0..4 (and 6, 8 where the
engine allows) and vLLM's static table.

Every run is repeated over ``seeds`` and each cell holds the mean of every column. One seed is one draw of
the arrivals, lengths and per-request acceptance: at 0.5 QPS a 60 s cell's throughput moves by 30% from
seed to seed, and a 1% bar against the best of 14 single draws is mostly a test of which draw was luckiest.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from tqdm import tqdm

from specserve.sim.config import (
    BurstArrivals,
    MultiPeakArrivals,
    OscillationArrivals,
    PiecewiseArrivals,
    PoissonArrivals,
    Scenario,
    TraceArrivals,
)
from specserve.sim.metrics import summarize
from specserve.sim.runner import simulate
from specserve.sim.scenario import builtin_scenarios, load_scenario
from specserve.sim.steps import StepStats
from specserve.speculation import StepRecord

E2E_BAR = 1.02
P99_BAR = 1.05
ORACLE_BAR = 0.97
THROUGHPUT_BAR = 0.99
# Share of the arrival window with requests the engine could not schedule, above which a run is saturated. Runs
# are bimodal: every built-in run that keeps up has (nearly) none, batch-of-one engines at moderate load about a
# tenth (a queue of two forms whenever two requests overlap), and overloaded runs a third or more.
SATURATED_SHARE = 0.2
ORACLE = "oracle"
ZOO = ("static-table", "goodput", "bandit", "ucb", "slo", "kld", "mlp")
FIXED_KS = (0, 1, 2, 3, 4, 6, 8)
# Columns kept from each run summary, plus the two the leaderboard measures itself (``_run``).
KEPT = (
    "throughput_tok_s",
    "goodput_tok_s",
    "mean_e2e_s",
    "p99_e2e_s",
    "mean_tpot_s",
    "p99_tpot_s",
    "mean_k",
    "k_switches",
    "acceptance",
)
MEASURED = ("full_share", "arrival_span_s")


@dataclass(frozen=True, slots=True)
class Metric:
    key: str
    label: str
    lower_is_better: bool


MEAN_E2E = Metric("mean_e2e_s", "mean E2E", True)
P99_E2E = Metric("p99_e2e_s", "p99 E2E", True)
MEAN_TPOT = Metric("mean_tpot_s", "mean TPOT", True)
P99_TPOT = Metric("p99_tpot_s", "p99 TPOT", True)
THROUGHPUT = Metric("throughput_tok_s", "throughput", False)
GOODPUT = Metric("goodput_tok_s", "SLO goodput", False)
LATENCY = (MEAN_E2E, P99_E2E, MEAN_TPOT, P99_TPOT)


def rivals(policy: str, max_k: int) -> list[str]:
    """Every policy ``policy`` is measured against on an engine with ``max_k`` (the oracle is a reference, not a
    rival)."""
    fixed = [f"fixed:k={k}" for k in FIXED_KS if k <= max_k]
    return [spec for spec in (*fixed, *ZOO) if spec != policy]


def is_dynamic(scenario: Scenario) -> bool:
    """The arrival rate changes during the run. A trace counts as static: the built-in ones are offline
    batches (DSDE's 128 prompts at t = 0)."""
    return len(static_rates(scenario)) > 1 or (
        not isinstance(scenario.workload.arrivals, PoissonArrivals | TraceArrivals) and len(static_rates(scenario)) > 0
    )


def static_rates(scenario: Scenario) -> list[float]:
    """The distinct positive rates the scenario holds still, ascending (none for a trace)."""
    arrivals = scenario.workload.arrivals
    if isinstance(arrivals, PoissonArrivals):
        rates = [arrivals.rate_qps]
    elif isinstance(arrivals, PiecewiseArrivals):
        rates = [segment.rate_qps for segment in arrivals.segments]
    elif isinstance(arrivals, BurstArrivals | MultiPeakArrivals):
        rates = [arrivals.base_qps, arrivals.peak_qps]
    elif isinstance(arrivals, OscillationArrivals):
        rates = [arrivals.high_qps, arrivals.low_qps]
    else:
        rates = []
    return sorted({rate for rate in rates if rate > 0})


def at_static_rate(scenario: Scenario, rate_qps: float, window_s: float) -> Scenario:
    """The scenario under steady Poisson arrivals at ``rate_qps``; a Poisson scenario is returned as it is."""
    if not is_dynamic(scenario):
        return scenario
    arrivals = PoissonArrivals(kind="poisson", rate_qps=rate_qps, duration_s=window_s)
    workload = scenario.workload.model_copy(update={"arrivals": arrivals})
    # Regime changes are set by arrival time on the dynamic run's clock; a static cell keeps the first regime.
    acceptance = scenario.acceptance.model_copy(update={"regimes": []})
    return scenario.model_copy(
        update={"name": f"{scenario.name}@{rate_qps:g}qps", "workload": workload, "acceptance": acceptance}
    )


@dataclass(frozen=True, slots=True)
class Cell:
    """One scenario run (a whole scenario, or one static rate of it) under every policy."""

    scenario: str
    rate_qps: float | None  # None: the scenario as written
    results: dict[str, dict]  # policy spec -> kept summary columns, means over seeds
    has_slo: bool = False

    def best_rival(self, policy: str, metric: Metric = THROUGHPUT) -> str:
        """The best policy on ``metric`` other than ``policy`` and the oracle."""
        others = [s for s in self.results if s not in (policy, ORACLE)]
        pick = min if metric.lower_is_better else max
        return pick(others, key=lambda s: self.results[s][metric.key])

    def ratio(self, policy: str, metric: Metric = THROUGHPUT) -> float:
        """``policy``'s value over the best rival's: at most 1 is as good on a latency, at least 1 on a rate."""
        return _ratio(self.results[policy][metric.key], self.results[self.best_rival(policy, metric)][metric.key])

    def oracle_ratio(self, policy: str, metric: Metric = GOODPUT) -> float | None:
        """``policy``'s value over the oracle's; None when the oracle did not run."""
        if ORACLE not in self.results:
            return None
        return _ratio(self.results[policy][metric.key], self.results[ORACLE][metric.key])

    @property
    def offline(self) -> bool:
        """Every request arrives at once (the built-in traces): the run is the time to serve a batch."""
        return all(r["arrival_span_s"] == 0 for r in self.results.values())

    @property
    def saturated(self) -> bool:
        """The median policy left requests unscheduled for at least ``SATURATED_SHARE`` of the arrival window."""
        return statistics.median(r["full_share"] for r in self.results.values()) >= SATURATED_SHARE

    @property
    def load(self) -> str:
        return "offline" if self.offline else "saturated" if self.saturated else "open"

    def metrics(self) -> list[Metric]:
        """What this cell compares: the latencies always, throughput where it separates policies, goodput under
        an SLO."""
        return [
            *LATENCY,
            *([THROUGHPUT] if self.offline or self.saturated else []),
            *([GOODPUT] if self.has_slo else []),
        ]


def _ratio(ours: float, theirs: float) -> float:
    return ours / theirs if theirs > 0 else 1.0


@dataclass(frozen=True, slots=True)
class Leaderboard:
    policy: str
    seeds: tuple[int, ...]
    static: list[Cell]
    dynamic: list[Cell]
    whole: list[Cell]  # every scenario as written (for the switching test)

    def latency_pass(self) -> bool:
        return all(
            cell.ratio(self.policy, MEAN_E2E) <= E2E_BAR and cell.ratio(self.policy, P99_E2E) <= P99_BAR
            for cell in self.static
        )

    def throughput_cells(self) -> list[Cell]:
        return [cell for cell in self.static if THROUGHPUT in cell.metrics()]

    def throughput_pass(self) -> bool:
        return all(cell.ratio(self.policy) >= THROUGHPUT_BAR for cell in self.throughput_cells())

    def oracle_distances(self, metric: Metric = GOODPUT) -> dict[str, float]:
        """Per policy (ours, every rival): mean over the static cells of its ``metric`` over the oracle's, best
        first; empty when the oracle did not run."""
        cells = [cell for cell in self.static if ORACLE in cell.results]
        if not cells:
            return {}
        specs = set.intersection(*(set(cell.results) for cell in cells)) - {ORACLE}
        means = {spec: sum(cell.oracle_ratio(spec, metric) or 0.0 for cell in cells) / len(cells) for spec in specs}
        return dict(sorted(means.items(), key=lambda item: item[1], reverse=not metric.lower_is_better))

    def oracle_pass(self) -> bool:
        distances = self.oracle_distances()
        return not distances or distances[self.policy] >= ORACLE_BAR

    def dynamic_means(self) -> dict[str, float]:
        """Per policy: mean over dynamic scenarios of throughput / the scenario's best (the oracle left out)."""
        if not self.dynamic:
            return {}
        specs = set.intersection(*(set(cell.results) for cell in self.dynamic)) - {ORACLE}
        means = {}
        for spec in specs:
            ratios = [
                cell.results[spec]["throughput_tok_s"] / max(cell.results[s]["throughput_tok_s"] for s in specs)
                for cell in self.dynamic
            ]
            means[spec] = sum(ratios) / len(ratios)
        return dict(sorted(means.items(), key=lambda item: -item[1]))

    def dynamic_pass(self) -> bool:
        means = self.dynamic_means()
        return not means or next(iter(means)) == self.policy

    def switches(self) -> list[tuple[str, int, int]]:
        """(scenario, switches of the policy, switches of bandit) for every whole scenario."""
        return [
            (cell.scenario, cell.results[self.policy]["k_switches"], cell.results["bandit"]["k_switches"])
            for cell in self.whole
            if "bandit" in cell.results
        ]

    def switches_pass(self) -> bool:
        return all(ours < theirs for _, ours, theirs in self.switches())

    def verdicts(self) -> dict[str, bool]:
        return {
            "latency": self.latency_pass(),
            "oracle": self.oracle_pass(),
            "throughput": self.throughput_pass(),
            "dynamic": self.dynamic_pass(),
            "switches": self.switches_pass(),
        }

    def passed(self) -> bool:
        return all(self.verdicts().values())


def single_replica_scenarios() -> list[str]:
    """The built-in scenarios of one replica, by name: the leaderboard's default."""
    return sorted(name for name in builtin_scenarios() if load_scenario(name).num_replicas == 1)


def evaluate(
    policy: str = "adaptive",
    scenarios: Sequence[str] | None = None,
    seeds: Sequence[int] = (0, 1, 2),
    static_window_s: float = 60.0,
    workers: int | None = None,
    oracle: bool = True,
) -> Leaderboard:
    """Run ``policy``, its rivals and (with ``oracle``) the oracle on every scenario (default: every built-in one of
    a single replica) as written and at each static rate, once per seed; cells hold the means over seeds.

    The cluster rehearsals (``num_replicas`` > 1, such as an hour of 64 replicas) are left out by default: a cell
    there is a whole cluster's run, about 40 minutes each on a development machine, and what they test (the
    cluster planner, the router, the simulator's speed) is not a policy's per-replica latency;
    ``bench/sim_scale.py`` runs them."""
    seeds = tuple(seeds)
    if not seeds:
        raise ValueError("seeds is empty: the leaderboard needs at least one seed")
    names = list(scenarios) if scenarios else single_replica_scenarios()
    jobs: list[tuple[str, float | None, Scenario, str]] = []
    dynamic_labels, slo_labels = set(), set()
    for name in names:
        scenario = load_scenario(name)
        label = scenario.name
        if is_dynamic(scenario):
            dynamic_labels.add(label)
        if scenario.slo is not None:
            slo_labels.add(label)
        specs = [policy, *rivals(policy, scenario.engine.max_k), *([ORACLE] if oracle and policy != ORACLE else [])]
        jobs += [(label, None, scenario, spec) for spec in specs]
        if is_dynamic(scenario):
            for rate in static_rates(scenario):
                jobs += [(label, rate, at_static_rate(scenario, rate, static_window_s), spec) for spec in specs]
    runs_by_cell: dict[tuple[str, float | None], dict[str, list[dict]]] = {}
    seeded = [(job, seed) for job in jobs for seed in seeds]
    workers = workers or max(1, min(len(seeded), os.cpu_count() or 1))
    with ProcessPoolExecutor(workers) as pool:
        runs = pool.map(_run, [(scenario, spec, seed) for (_, _, scenario, spec), seed in seeded], chunksize=1)
        for ((label, rate, _, spec), _), summary in tqdm(
            zip(seeded, runs, strict=True), total=len(seeded), desc="leaderboard", unit="run", file=sys.stderr
        ):
            runs_by_cell.setdefault((label, rate), {}).setdefault(spec, []).append(summary)
    results = {
        cell: {spec: _mean(summaries) for spec, summaries in by_spec.items()} for cell, by_spec in runs_by_cell.items()
    }
    cells = {key: Cell(key[0], key[1], res, key[0] in slo_labels) for key, res in results.items()}
    whole = [cell for (_, rate), cell in cells.items() if rate is None]
    dynamic = [cell for cell in whole if cell.scenario in dynamic_labels]
    static = [cell for (_, rate), cell in cells.items() if rate is not None]
    static += [cell for cell in whole if cell.scenario not in dynamic_labels]
    static.sort(key=lambda cell: (cell.scenario, cell.rate_qps or 0.0))
    return Leaderboard(policy, seeds, static, dynamic, whole)


def _mean(summaries: list[dict]) -> dict:
    return {key: sum(s[key] for s in summaries) / len(summaries) for key in (*KEPT, *MEASURED)}


def _run(job: tuple[Scenario, str, int]) -> dict:
    scenario, spec, seed = job
    steps: list[tuple[float, float]] = []

    def unscheduled(record: StepRecord, stats: StepStats) -> None:
        if stats.num_waiting or stats.num_preempted:
            steps.append((record.now_s, record.duration_s))

    result = simulate(scenario, spec, seed, on_step=unscheduled)
    summary = summarize(result)
    arrivals = result.table.arrival_s
    first_s, last_s = (float(arrivals.min()), float(arrivals.max())) if len(arrivals) else (0.0, 0.0)
    span_s = last_s - first_s
    return {
        **{key: summary[key] for key in KEPT},
        "full_share": full_share(steps, first_s, last_s),
        "arrival_span_s": span_s,
    }


def full_share(steps: Sequence[tuple[float, float]], first_s: float, last_s: float) -> float:
    """Share of the arrival window [first_s, last_s] spent in steps (start, duration) that left requests
    unscheduled; a step is counted from its start, up to the window's end. 0 for an empty window."""
    if last_s <= first_s:
        return 0.0
    busy = sum(min(start + duration, last_s) - start for start, duration in steps if first_s <= start < last_s)
    return busy / (last_s - first_s)


def fixed_k(spec: str) -> int | None:
    match = re.fullmatch(r"fixed:k=(\d+)", spec)
    return int(match.group(1)) if match else None
