"""The simulator's closed loop (arrivals kind ``clients``): the load generator's ``--clients`` rule, run in virtual
time, its requests the same under every policy, and its rate taken within the schedule as ``bench`` takes it."""

from __future__ import annotations

import numpy as np
import pytest
from sim_helpers import small_scenario

import specserve.sim.feeds as feeds
from specserve.bench.load import Phase, Plan
from specserve.sim import simulate, summarize
from specserve.sim.scenario import ScenarioError
from specserve.sim.workload import clients_at

PHASES = [{"clients": 2, "duration_s": 2.0}, {"clients": 6, "duration_s": 2.0}, {"clients": 1, "duration_s": 3.0}]


def closed(phases: list[dict] = PHASES, **overrides):
    return small_scenario(workload={"arrivals": {"kind": "clients", "phases": phases}}, **overrides)


def in_flight(table, t_s: float) -> int:
    return int(np.count_nonzero((table.arrival_s <= t_s) & (t_s < table.finish_s)))


def test_the_clients_in_flight_follow_the_schedule() -> None:
    table = simulate(closed(), "fixed:k=2", seed=3).table
    # A rise starts the idle clients at once: exactly the phase's count in flight throughout.
    assert {in_flight(table, t) for t in np.arange(0.0, 4.0, 0.05)} - {0} <= {2, 6}
    assert in_flight(table, 1.0) == 2 and in_flight(table, 3.0) == 6
    # A fall lets the clients above it finish: never more than before, then the new count once they have.
    after = [in_flight(table, t) for t in np.arange(4.0, 7.0, 0.05)]
    assert max(after) <= 6 and after[-1] == 1 and after == sorted(after, reverse=True)
    # Nothing is sent after the schedule, and everything sent is answered.
    assert table.arrival_s.max() < 7.0 and not np.isnan(table.finish_s).any()


def test_a_client_sends_the_moment_its_last_request_is_answered() -> None:
    table = simulate(closed(), "fixed:k=2", seed=3).table
    phase_starts = {0.0, 2.0, 4.0}
    assert set(table.arrival_s.tolist()) <= set(table.finish_s.tolist()) | phase_starts
    assert np.count_nonzero(table.arrival_s == 0.0) == 2 and np.count_nonzero(table.arrival_s == 2.0) == 4


def test_request_n_is_the_same_request_under_every_policy() -> None:
    slow, fast = (simulate(closed(), policy, seed=5) for policy in ("fixed:k=0", "fixed:k=4"))
    n = min(len(slow.table.arrival_s), len(fast.table.arrival_s))
    assert len(slow.table.arrival_s) != len(fast.table.arrival_s)  # the loop follows the engine's speed
    for column in ("prompt_tokens", "output_tokens", "alpha"):
        assert np.array_equal(getattr(slow.table, column)[:n], getattr(fast.table, column)[:n])


def test_a_request_takes_the_acceptance_regime_in_force_when_it_is_sent() -> None:
    scenario = closed(acceptance={"mean": 0.9, "concentration": None, "regimes": [{"start_s": 4.0, "mean": 0.2}]})
    table = simulate(scenario, "fixed:k=2", seed=1).table
    assert np.array_equal(table.alpha, np.where(table.arrival_s < 4.0, 0.9, 0.2))


def test_the_rate_is_taken_within_the_schedule_and_split_by_phase() -> None:
    result = simulate(closed(), "fixed:k=2", seed=3)
    summary = summarize(result)
    phases = summary["phases"]
    assert [(p["clients"], p["start_s"], p["s"]) for p in phases] == [(2, 0.0, 2.0), (6, 2.0, 2.0), (1, 4.0, 3.0)]
    window_tokens = sum(p["output_tokens"] for p in phases)
    assert summary["throughput_tok_s"] == pytest.approx(window_tokens / 7.0)
    # The drain after the schedule is left out, and each phase's tokens are the steps that ended within it.
    assert window_tokens < result.table.num_output.sum()
    end_s = np.concatenate([r.series_end_s for r in result.replicas])
    tokens = np.concatenate([r.series_tokens for r in result.replicas])
    assert phases[1]["output_tokens"] == tokens[(end_s > 2.0) & (end_s <= 4.0)].sum() > phases[0]["output_tokens"]
    assert "phases" not in summarize(simulate(small_scenario(), "fixed:k=2", seed=3))


def test_requests_are_drawn_chunk_by_chunk_as_the_clients_send(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(feeds, "CHUNK", 8)
    result = simulate(closed(), "fixed:k=2", seed=3)
    table = result.table
    assert len(table.arrival_s) > 3 * 8
    assert table.request_ids.tolist() == [str(i) for i in range(len(table.arrival_s))]
    assert not np.isnan(table.arrival_s).any() and len(result.workload) == len(table.arrival_s)
    assert np.array_equal(result.workload.arrival_s, table.arrival_s)


def test_the_same_seed_gives_the_same_closed_loop() -> None:
    a, b = (summarize(simulate(closed(), "adaptive", seed=9)) for _ in range(2))
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b


def test_bad_schedules_are_errors_naming_the_problem() -> None:
    with pytest.raises(ScenarioError, match="no phase has a client"):
        closed([{"clients": 0, "duration_s": 1.0}])
    with pytest.raises(ScenarioError, match="phases.0.clients"):
        closed([{"clients": -1, "duration_s": 1.0}, {"clients": 1, "duration_s": 1.0}])
    with pytest.raises(ScenarioError, match="phases.0.duration_s"):
        closed([{"clients": 1, "duration_s": 0}])
    batch = {"arrivals": {"kind": "poisson", "rate_qps": 1, "duration_s": 1}}
    with pytest.raises(ScenarioError, match="drop workload.batch"):
        small_scenario(workload={"arrivals": {"kind": "clients", "phases": PHASES}, "batch": batch})


def test_the_load_generator_and_the_simulator_read_one_schedule() -> None:
    phases = [Phase(1, 2.0), Phase(4, 3.0)]
    plan = Plan(np.zeros(1, np.int64), np.zeros(1, np.int64), phases=tuple(phases), concurrency=4)
    for t in (0.0, 1.99, 2.0, 4.9, 5.0, 9.0):
        assert plan.clients_at(t) == clients_at(phases, t)
    assert clients_at(phases, 5.0)[0] == 0
