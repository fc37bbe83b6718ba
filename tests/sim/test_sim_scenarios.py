"""Scenario files and their schema: built-ins load and run, bad keys and names are named in the error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sim_helpers import small_scenario

from specserve.sim import (
    ScenarioError,
    builtin_scenarios,
    load_scenario,
    parse_scenario,
    resolve,
    run_scenario,
    simulate,
    summarize,
)
from specserve.sim.cluster_slice import cluster_slice

# One built-in per paper's main setting; a missing file fails here, not in a benchmark.
REQUIRED_BUILTINS = {
    "turbospec-h100-qps-sweep",
    "turbospec-h100-dynamic-qps",
    "nightjar-4090-7b-dynamic",
    "nightjar-a100-13b-dynamic",
    "nightjar-l20x2-32b-dynamic",
    "adaspec-a100-7b-trace",
    "dsde-a100x8-70b-bs1",
    "dsde-a100x8-70b-bs8",
    "dsde-a100x8-70b-bs32",
    "dsde-a100x8-70b-bs64",
    "speckv-3090-3b",
    "eagle-h100-8b",  # not a paper's: Llama-3.1-8B + an EAGLE-style head
}
# Simulated seconds of arrivals kept per built-in in the brief run: enough for a few requests each.
BRIEF_ARRIVALS_S = 12.0
# Rows of a trace kept in the brief run (the DSDE sweep's 128 prompts at batch 1 take seconds to simulate).
BRIEF_TRACE_ROWS = 16
# A cluster built-in runs briefly on this many replicas at its per-replica load (sim.cluster_slice): 64 replicas
# for 12 s of arrivals would take a minute per policy.
BRIEF_REPLICAS = 8


def test_builtins_exist_load_and_resolve() -> None:
    assert REQUIRED_BUILTINS <= set(builtin_scenarios())
    for name in builtin_scenarios():
        scenario = load_scenario(name)
        assert scenario.name == name and scenario.description
        assert resolve(scenario).num_kv_blocks > 0


def _brief(name: str, tmp_path):
    """The built-in with its arrivals cut to BRIEF_ARRIVALS_S seconds (leading idle segments dropped) or its trace
    to its first BRIEF_TRACE_ROWS requests (a copy in ``tmp_path``)."""
    scenario = load_scenario(name)
    if scenario.num_replicas > BRIEF_REPLICAS:
        scenario = cluster_slice(scenario, BRIEF_REPLICAS)
    arrivals = scenario.workload.arrivals.model_dump()
    if arrivals["kind"] == "trace":
        lines = Path(arrivals["path"]).read_text().splitlines(keepends=True)
        arrivals["path"] = str(tmp_path / "brief.csv")
        Path(arrivals["path"]).write_text("".join(lines[: BRIEF_TRACE_ROWS + 1]))
    if arrivals["kind"] == "piecewise":
        kept, t = [], 0.0
        segments = arrivals["segments"]
        while len(segments) > 1 and segments[0]["rate_qps"] == 0:
            segments = segments[1:]
        for segment in segments:
            if t >= BRIEF_ARRIVALS_S:
                break
            kept.append({**segment, "duration_s": min(segment["duration_s"], BRIEF_ARRIVALS_S - t)})
            t += segment["duration_s"]
        arrivals["segments"] = kept
    elif "duration_s" in arrivals:
        arrivals["duration_s"] = min(arrivals["duration_s"], BRIEF_ARRIVALS_S)
    workload = scenario.workload.model_copy(update={"arrivals": type(scenario.workload.arrivals)(**arrivals)})
    return scenario.model_copy(update={"workload": workload})


@pytest.mark.parametrize("name", sorted(builtin_scenarios()))
@pytest.mark.parametrize("policy", ["fixed:k=0", "fixed:k=3", "adaptive"])
def test_every_builtin_runs_briefly_and_conserves_tokens(name: str, policy: str, tmp_path) -> None:
    result = simulate(_brief(name, tmp_path), policy, seed=0)
    table = result.table
    assert len(table.arrival_s) > 0
    assert np.array_equal(table.num_output, table.output_tokens)
    assert all(replica.num_kv_blocks_free == result.resolved.num_kv_blocks for replica in result.replicas)
    summary = summarize(result)
    assert summary["throughput_tok_s"] > 0 and summary["mean_tpot_s"] > 0
    assert 0 <= summary["acceptance"] <= 1 and summary["mean_k"] <= result.resolved.scenario.engine.max_k


def test_eagle_scenario_speculation_pays_at_low_load() -> None:
    # eagle-h100-8b at its first segment's rate (1 QPS, here 15 s): the cheap head makes long chains pay.
    scenario = load_scenario("eagle-h100-8b")
    arrivals = {"kind": "poisson", "rate_qps": 1, "duration_s": 15}
    scenario = parse_scenario({**scenario.model_dump(), "workload": {"dataset": "sharegpt", "arrivals": arrivals}})
    e2e = {k: summarize(simulate(scenario, f"fixed:k={k}", seed=0))["mean_e2e_s"] for k in (0, 1, 4)}
    assert e2e[4] < e2e[1] < e2e[0] / 1.5


def test_unknown_key_is_named() -> None:
    raw = small_scenario().model_dump()
    raw["engine"]["max_num_seq"] = 8
    with pytest.raises(ScenarioError, match=r"engine\.max_num_seq"):
        parse_scenario(raw)


def test_bad_value_is_named() -> None:
    raw = small_scenario().model_dump()
    raw["acceptance"]["mean"] = 1.5
    with pytest.raises(ScenarioError, match=r"acceptance\.mean"):
        parse_scenario(raw)


def test_unknown_profile_lists_known_names() -> None:
    with pytest.raises(ScenarioError, match=r"unknown hardware profile 'b200'.*h100"):
        resolve(small_scenario(hardware="b200"))


def test_linear_latency_needs_a_fit_for_the_hardware() -> None:
    with pytest.raises(ScenarioError, match=r"'linear'.*'l40s'"):
        resolve(small_scenario(hardware="l40s"))


def test_unknown_scenario_name_and_bad_file(tmp_path) -> None:
    with pytest.raises(ScenarioError, match=r"unknown scenario 'nope'"):
        load_scenario("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "hardware: h100\npair: llama2-7b+160m\nworkload: {arrivals: {kind: poisson}}\nacceptance: {mean: 0.5}\n"
    )
    with pytest.raises(ScenarioError, match=r"workload\.arrivals\.poisson\.rate_qps"):
        load_scenario(str(bad))


def test_scenario_file_with_relative_trace(tmp_path) -> None:
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0.0,32,8\n0.2,64,16\n1.0,16,4\n")
    path = tmp_path / "mine.yaml"
    path.write_text(
        "hardware: h100\npair: llama2-7b+160m\nlatency: {kind: linear}\n"
        "workload: {arrivals: {kind: trace, path: t.csv}}\nacceptance: {mean: 0.6}\n"
    )
    summary = run_scenario(str(path), "fixed:k=2", seed=0, with_series=True)
    assert summary["num_requests"] == 3
    assert summary["throughput_tok_s"] > 0
    assert len(summary["k_series"][0]["k"]) == summary["num_steps"]


def test_request_longer_than_the_kv_cache_is_refused() -> None:
    scenario = small_scenario(engine={"num_kv_blocks": 4})
    with pytest.raises(ScenarioError, match=r"exceeds the KV cache"):
        run_scenario(scenario, "fixed:k=0")
