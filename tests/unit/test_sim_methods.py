"""The simulator per speculative method (sim/proposer.py) and its mixed-acceptance workloads."""

from __future__ import annotations

import numpy as np
import pytest

from specserve.sim import simulate
from specserve.sim.config import AcceptanceConfig, Scenario
from specserve.sim.profiles import pair_profiles
from specserve.sim.scenario import load_scenario, parse_scenario, resolve
from specserve.sim.true_acceptance import TrueAcceptance
from specserve.speculation import StepRecord


def scenario(pair: str, k: int, clients: int = 8, **engine: bool) -> Scenario:
    return parse_scenario(
        {
            "name": f"{pair}-k{k}",
            "hardware": "h100",
            "pair": pair,
            "latency": {"kind": "linear"},
            "engine": {"max_k": 4, **engine},
            "workload": {
                "dataset": "sharegpt",
                "arrivals": {"kind": "clients", "phases": [{"clients": clients, "duration_s": 5}]},
            },
            "acceptance": {"mean": 0.7},
        }
    )


def records(pair: str, policy: str, **engine: bool) -> list[StepRecord]:
    seen: list[StepRecord] = []
    simulate(scenario(pair, 0, **engine), policy, 0, on_step=lambda record, _: seen.append(record))
    return seen


def test_a_lookup_has_no_weights_no_kv_and_at_k0_runs_nothing() -> None:
    lookup, draft = resolve(scenario("llama3.1-8b+ngram", 0)), resolve(scenario("llama3.1-8b+1b", 0))
    assert lookup.draft is None and lookup.num_draft_weight_blocks == 0
    assert lookup.num_kv_blocks > draft.num_kv_blocks  # no draft weights, no draft KV per block
    assert all(r.num_draft_passes == 0 and not r.draft_s for r in records("llama3.1-8b+ngram", "fixed:k=0"))


def test_a_lookup_finds_all_k_drafts_in_one_search_and_leaves_no_signals() -> None:
    steps = [r for r in records("llama3.1-8b+ngram", "fixed:k=4") if r.num_drafted]
    assert steps and all(r.num_draft_passes == 1 for r in steps)
    assert all(not r.draft_confidence_per_request for r in steps)  # a lookup samples no logits
    heads = [r for r in records("llama3.1-8b+eagle", "fixed:k=4") if r.num_drafted]
    assert all(r.num_draft_passes == 4 for r in heads)


def test_an_eagle_head_runs_its_pass_at_k0_whatever_the_engine_says() -> None:
    head = records("llama3.1-8b+eagle", "fixed:k=0", k0_runs_draft_pass=False)
    assert all(r.num_draft_passes == 1 for r in head if r.num_running)
    draft = records("llama3.1-8b+1b", "fixed:k=0", k0_runs_draft_pass=False)
    assert any(r.num_draft_passes == 0 for r in draft)


def test_a_lookup_costs_a_speculating_step_about_the_same_at_any_k() -> None:
    timer = resolve(scenario("llama3.1-8b+ngram", 0)).timer
    head = resolve(scenario("llama3.1-8b+eagle", 0)).timer
    lookup_share = timer.draft.forward_s(16 * 500, 16) / timer.step_s(16 * 500, 64, [16])
    head_share = 3 * head.draft.forward_s(16 * 500, 16) / head.step_s(16 * 500, 64, [16] * 3)
    assert lookup_share < head_share / 2


def test_a_pair_must_match_its_method() -> None:
    assert pair_profiles()["llama3.1-8b+ngram"].method == "ngram"
    with pytest.raises(ValueError, match="offload"):
        resolve(parse_scenario({**scenario("llama3.1-8b+ngram", 0).model_dump(), "memory": {"offload": True}}))


def test_mixed_classes_draw_each_request_from_its_kind() -> None:
    cfg = AcceptanceConfig(
        mean=0.445, concentration=20, classes=[{"share": 0.3, "mean": 0.9}, {"share": 0.7, "mean": 0.25}]
    )
    alphas = TrueAcceptance(cfg, 4).draw_alphas(np.zeros(4000), np.random.default_rng(0))
    high = alphas > 0.6
    assert high.mean() == pytest.approx(0.3, abs=0.03)
    assert alphas[high].mean() == pytest.approx(0.9, abs=0.02) and alphas[~high].mean() == pytest.approx(0.25, abs=0.02)
    with pytest.raises(ValueError, match="weighted mean"):
        AcceptanceConfig(mean=0.6, classes=[{"share": 0.3, "mean": 0.9}, {"share": 0.7, "mean": 0.25}])


def test_the_built_in_method_scenarios_load() -> None:
    for name in (
        "mixed-ngram-h100-8b",
        "method-draft-h100-8b-batch",
        "method-eagle-h100-8b-batch",
        "method-ngram-h100-8b-batch",
    ):
        assert resolve(load_scenario(name)).timer is not None
