"""Discrete-event simulator of speculative-decoding LLM serving that drives the real policies.

Pure: imports none of ray, vllm, torch or prometheus_client (house rule 1). The same ``make_policy``
objects that run inside vLLM choose k here, step by step, in virtual time.

    from specserve.sim import run_scenario
    run_scenario("turbospec-h100-qps-sweep", "adaptive", seed=0)["throughput_tok_s"]

This package is the kernel. The paper campaign built on it (reproduce, leaderboard, latency-check, their
reports and the papers' numbers) is the lab's (``lab/experiments``, outside the installed package), which imports
this package and never the reverse.
"""

from specserve.sim.config import Scenario
from specserve.sim.kernel import PolicyFactory, SimResult, Simulator
from specserve.sim.metrics import k_series, summarize
from specserve.sim.runner import run_scenario, simulate
from specserve.sim.scenario import ScenarioError, builtin_scenarios, load_scenario, parse_scenario, resolve
from specserve.sim.steps import StepStats

__all__ = [
    "PolicyFactory",
    "Scenario",
    "ScenarioError",
    "SimResult",
    "Simulator",
    "StepStats",
    "builtin_scenarios",
    "k_series",
    "load_scenario",
    "parse_scenario",
    "resolve",
    "run_scenario",
    "simulate",
    "summarize",
]
