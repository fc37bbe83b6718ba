"""Run one scenario under one policy: the entry point for the command line, tests and benchmarks."""

from __future__ import annotations

from typing import Any

from specserve.sim.config import Scenario
from specserve.sim.kernel import PolicyFactory, SimResult, Simulator
from specserve.sim.metrics import k_series, summarize
from specserve.sim.parallel import DEFAULT_SYNC_S
from specserve.sim.scenario import load_scenario, resolve
from specserve.sim.steps import StepListener


def simulate(
    scenario: Scenario | str,
    policy: str | PolicyFactory,
    seed: int = 0,
    on_step: StepListener | None = None,
    max_trace_events: int = 0,
    workers: int = 1,
    sync_s: float = DEFAULT_SYNC_S,
) -> SimResult:
    """The full result of a run; ``scenario`` is a Scenario, a built-in name or a YAML path, ``policy`` a spec
    (``NAME[:key=value,...]``) or a factory that builds each replica's policy from the engine's traits. ``workers`` > 1
    steps the replicas in that many processes, synced every ``sync_s`` simulated seconds (parallel.py)."""
    if isinstance(scenario, str):
        scenario = load_scenario(scenario)
    return Simulator(resolve(scenario), policy, seed, on_step, max_trace_events, workers, sync_s).run()


def run_scenario(
    scenario: Scenario | str, policy: str | PolicyFactory, seed: int = 0, with_series: bool = False
) -> dict:
    """Summary metrics of one run (metrics.summarize); with ``with_series`` also ``k_series`` per replica."""
    result = simulate(scenario, policy, seed)
    summary: dict[str, Any] = summarize(result)
    if with_series:
        summary["k_series"] = k_series(result)
    return summary
