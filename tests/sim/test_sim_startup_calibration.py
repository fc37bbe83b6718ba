"""The start-up calibration, planned once for the served engine and the simulator, and run by the simulator as a
served replica runs it: its policy starts from the runs' step costs."""

from __future__ import annotations

from itertools import pairwise

import pytest

from specserve.sim import load_scenario, simulate, summarize
from specserve.sim.config import Scenario
from specserve.sim.kernel import startup_history
from specserve.speculation import EngineTraits, StepRecord
from specserve.speculation.policies.adaptive import AdaptivePolicy
from specserve.speculation.startup_checks import BATCH_GROWTH, SMALL_BATCH_SIZES, batch_sizes, plan


@pytest.mark.parametrize("max_num_seqs", [1, 2, 8, 9, 33, 256, 1024])
def test_the_batch_sizes_reach_max_num_seqs_growing_at_most_fourfold_past_the_small_ones(max_num_seqs: int) -> None:
    sizes = batch_sizes(max_num_seqs)
    assert sizes[0] == 1 and sizes[-1] == max_num_seqs
    assert list(sizes) == sorted(set(sizes))
    assert set(sizes) >= {min(b, max_num_seqs) for b in SMALL_BATCH_SIZES}
    assert all(b <= a * BATCH_GROWTH for a, b in pairwise(sizes) if a >= max(SMALL_BATCH_SIZES))


def test_the_plan_runs_every_k_at_every_batch_size() -> None:
    probes = plan(3, 256)
    assert {(p.k, p.batch) for p in probes} == {(k, b) for k in range(4) for b in batch_sizes(256)}


def closed_loop(clients: int, *, calibrated: bool, drafts_ahead: bool = True) -> Scenario:
    """Llama-3.1-8B + 1B draft on an H100, k = 0 skipping the draft's pass, a closed loop of ``clients`` from the
    start: the case where a cold ``adaptive`` stayed near k = 0."""
    base = load_scenario("method-draft-h100-8b-batch")
    engine = base.engine.model_copy(update={"drafts_ahead": drafts_ahead, "startup_calibration": calibrated})
    arrivals = base.workload.arrivals.model_validate(
        {"kind": "clients", "phases": [{"clients": clients, "duration_s": 20}]}
    )
    workload = base.workload.model_copy(update={"arrivals": arrivals})
    return base.model_copy(update={"engine": engine, "workload": workload})


def test_the_history_covers_the_plan_and_says_nothing_of_acceptance() -> None:
    scenario = closed_loop(64, calibrated=True)
    history = startup_history(scenario)
    engine = scenario.engine
    assert {(r.k, r.num_running) for r in history} >= {(p.k, p.batch) for p in plan(engine.max_k, engine.max_num_seqs)}
    assert all(not r.num_drafted_per_request and not r.request_ids for r in history)
    # The traffic is not part of it: another load of the same engine starts from the same steps.
    assert startup_history(closed_loop(4, calibrated=True)) == history


def first_step_state(calibrated: bool) -> tuple[float, list[float], int]:
    """The policy's step-cost samples and acceptance estimate as the first served step ends, and the history's
    length."""
    policies: list[AdaptivePolicy] = []

    def build(traits: EngineTraits) -> AdaptivePolicy:
        policies.append(AdaptivePolicy(AdaptivePolicy.Params(), traits))
        return policies[-1]

    seen: list[tuple[float, list[float]]] = []

    def on_step(record: StepRecord, stats: object) -> None:
        if not seen:
            seen.append((policies[0].latency.num_samples, policies[0].core.acceptance.alphas()))

    scenario = closed_loop(4, calibrated=calibrated)
    simulate(scenario, build, 0, on_step=on_step)
    return *seen[0], len(startup_history(scenario))


def test_a_calibrated_policy_starts_from_the_runs_step_costs_never_their_acceptance() -> None:
    samples, alphas, num_records = first_step_state(calibrated=True)
    cold_samples, cold_alphas, _ = first_step_state(calibrated=False)
    # Forgotten at a half-life of 1,000 steps, a few hundred calibration steps count nearly in full.
    assert samples > num_records / 2 and cold_samples <= 1
    # The dummy requests' drafts are no evidence of how served traffic accepts.
    assert alphas == cold_alphas


def test_calibrated_adaptive_serves_a_cold_closed_loop_of_64_clients_as_well_as_the_best_fixed_k() -> None:
    """Cold, its step-cost fit had seen k > 0 only in probes whose first pass also caught up the skipped tokens,
    so it priced k = 1 at about twice its cost and stayed near k = 0, 19 % below k = 1."""
    fixed = {k: summarize(simulate(closed_loop(64, calibrated=True), f"fixed:k={k}", 0)) for k in range(3)}
    best = max(s["throughput_tok_s"] for s in fixed.values())
    calibrated = summarize(simulate(closed_loop(64, calibrated=True), "adaptive", 0))["throughput_tok_s"]
    cold = summarize(simulate(closed_loop(64, calibrated=False), "adaptive", 0))["throughput_tok_s"]
    assert calibrated >= 0.97 * best
    assert cold < 0.97 * best
