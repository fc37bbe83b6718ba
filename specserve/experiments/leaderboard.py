"""One policy against the whole zoo: the bar the project set for ``adaptive``.

The bar:
- **static rates**: on every scenario, at each arrival rate it holds still, throughput at least
  ``STATIC_BAR`` x the best rival's. A Poisson or trace scenario is one static cell; a piecewise, burst, oscillation
  or multi-peak scenario contributes one cell per distinct positive rate, each run as its own Poisson
  scenario over ``static_window_s`` (the same hardware, pair, lengths and acceptance);
- **dynamic rates**: on the scenarios whose rate changes, the best mean over scenarios of throughput
  relative to each scenario's best policy;
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
from specserve.sim.runner import run_scenario
from specserve.sim.scenario import builtin_scenarios, load_scenario

STATIC_BAR = 0.99
ZOO = ("static-table", "goodput", "bandit", "ucb", "slo", "kld", "mlp")
FIXED_KS = (0, 1, 2, 3, 4, 6, 8)
# Columns kept from each run summary.
KEPT = ("throughput_tok_s", "mean_e2e_s", "p99_e2e_s", "mean_tpot_s", "mean_k", "k_switches", "acceptance")


def rivals(policy: str, max_k: int) -> list[str]:
    """Every policy ``policy`` is measured against on an engine with ``max_k``."""
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
    results: dict[str, dict]  # policy spec -> kept summary columns

    def best_rival(self, policy: str) -> str:
        return max((s for s in self.results if s != policy), key=lambda s: self.results[s]["throughput_tok_s"])

    def ratio(self, policy: str) -> float:
        """Throughput of ``policy`` over the best rival's."""
        best = self.results[self.best_rival(policy)]["throughput_tok_s"]
        return self.results[policy]["throughput_tok_s"] / best if best > 0 else 1.0


@dataclass(frozen=True, slots=True)
class Leaderboard:
    policy: str
    seeds: tuple[int, ...]
    static: list[Cell]
    dynamic: list[Cell]
    whole: list[Cell]  # every scenario as written (for the switching test)

    def static_pass(self) -> bool:
        return all(cell.ratio(self.policy) >= STATIC_BAR for cell in self.static)

    def dynamic_means(self) -> dict[str, float]:
        """Per policy: mean over dynamic scenarios of throughput / the scenario's best throughput."""
        if not self.dynamic:
            return {}
        specs = set.intersection(*(set(cell.results) for cell in self.dynamic))
        means = {}
        for spec in specs:
            ratios = [
                cell.results[spec]["throughput_tok_s"] / max(r["throughput_tok_s"] for r in cell.results.values())
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

    def passed(self) -> bool:
        return self.static_pass() and self.dynamic_pass() and self.switches_pass()


def evaluate(
    policy: str = "adaptive",
    scenarios: Sequence[str] | None = None,
    seeds: Sequence[int] = (0, 1, 2),
    static_window_s: float = 60.0,
    workers: int | None = None,
) -> Leaderboard:
    """Run ``policy`` and its rivals on every scenario (default: all built-in) as written and at each static rate,
    once per seed; cells hold the means over seeds."""
    seeds = tuple(seeds)
    if not seeds:
        raise ValueError("seeds is empty: the leaderboard needs at least one seed")
    names = list(scenarios) if scenarios else sorted(builtin_scenarios())
    jobs: list[tuple[str, float | None, Scenario, str]] = []
    dynamic_labels = set()
    for name in names:
        scenario = load_scenario(name)
        label = scenario.name
        if is_dynamic(scenario):
            dynamic_labels.add(label)
        specs = [policy, *rivals(policy, scenario.engine.max_k)]
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
    whole = [Cell(label, None, res) for (label, rate), res in results.items() if rate is None]
    dynamic = [cell for cell in whole if cell.scenario in dynamic_labels]
    static = [Cell(label, rate, res) for (label, rate), res in results.items() if rate is not None]
    static += [cell for cell in whole if cell.scenario not in dynamic_labels]
    static.sort(key=lambda cell: (cell.scenario, cell.rate_qps or 0.0))
    return Leaderboard(policy, seeds, static, dynamic, whole)


def _mean(summaries: list[dict]) -> dict:
    return {key: sum(s[key] for s in summaries) / len(summaries) for key in KEPT}


def _run(job: tuple[Scenario, str, int]) -> dict:
    scenario, spec, seed = job
    summary = run_scenario(scenario, spec, seed)
    return {key: summary[key] for key in KEPT}


def fixed_k(spec: str) -> int | None:
    match = re.fullmatch(r"fixed:k=(\d+)", spec)
    return int(match.group(1)) if match else None
