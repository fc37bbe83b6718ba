"""Small scenarios built in code, so the simulator tests run in well under a second each."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from specserve.sim import PolicyFactory, Scenario, parse_scenario
from specserve.speculation import EngineTraits, Policy, StepContext, make_policy


def small_scenario(**overrides: Any) -> Scenario:
    """Llama-2-7B + 160m on an H100 (calibrated linear times), Poisson 4 QPS for 10 s, short requests."""
    raw: dict[str, Any] = {
        "name": "small",
        "hardware": "h100",
        "pair": "llama2-7b+160m",
        "latency": {"kind": "linear"},
        "engine": {"max_k": 4},
        "workload": {
            "lengths": {
                "prompt_tokens": {"mean": 96, "std": 48, "max_tokens": 512},
                "output_tokens": {"mean": 64, "std": 32, "max_tokens": 256},
            },
            "arrivals": {"kind": "poisson", "rate_qps": 4, "duration_s": 10},
        },
        "acceptance": {"mean": 0.7},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    return parse_scenario(raw)


# A tiny scenario as YAML text, for the command-line tests that read scenario files.
SMALL_YAML = """\
description: a tiny scenario for the command-line tests
hardware: h100
pair: llama2-7b+160m
latency: {kind: linear}
engine: {max_k: 4}
workload:
  lengths: {prompt_tokens: {mean: 64, std: 16}, output_tokens: {mean: 32, std: 8}}
  arrivals: {kind: poisson, rate_qps: 4, duration_s: 5}
acceptance: {mean: 0.7}
"""


def sim_cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m specserve sim ARGS`` (the command users type) with stdout and stderr captured apart."""
    return subprocess.run([sys.executable, "-m", "specserve", "sim", *args], capture_output=True, text=True, timeout=60)


def recording_policy(spec: str, contexts: list[StepContext]) -> PolicyFactory:
    """A policy factory for the simulator whose policies append every StepContext they are asked about."""

    def build(traits: EngineTraits) -> Policy:
        policy = make_policy(spec, traits)
        choose = policy.choose
        policy.choose = lambda ctx: contexts.append(ctx) or choose(ctx)
        return policy

    return build
