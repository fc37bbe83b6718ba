"""Scenario files and their schema: built-ins load and run, bad keys and names are named in the error."""

from __future__ import annotations

import pytest
from sim_helpers import small_scenario

from specserve.sim import ScenarioError, builtin_scenarios, load_scenario, parse_scenario, resolve, run_scenario

REQUIRED_BUILTINS = {"turbospec-h100-qps-sweep", "nightjar-4090-7b-dynamic", "nightjar-a100-13b-dynamic"}


def test_builtins_exist_load_and_resolve() -> None:
    assert REQUIRED_BUILTINS <= set(builtin_scenarios())
    for name in builtin_scenarios():
        scenario = load_scenario(name)
        assert scenario.name == name and scenario.description
        assert resolve(scenario).num_kv_blocks > 0


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
    bad.write_text("hardware: h100\npair: llama2-7b+160m\nworkload: {arrivals: {kind: poisson}}\nacceptance: {mean: 0.5}\n")
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
