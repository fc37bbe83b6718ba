"""Replicas stepped in parallel processes (specserve/sim/parallel.py): synced at every event a two-process run is
the one-process run, draft moves included; synced within a step, so is a run without draft memory; synced coarsely
it serves every request once, the same way each time; what it cannot run is refused by name."""

from __future__ import annotations

import multiprocessing
import warnings

import numpy as np
import pytest

from specserve.memory import DraftState
from specserve.sim import ScenarioError, load_scenario, simulate, summarize
from specserve.sim.cluster_slice import cluster_slice
from specserve.sim.config import PiecewiseArrivals
from specserve.sim.parallel import ShortStepWarning
from specserve.sim.replica import Replica

# Finer than the gap between any two events of the run: every window holds at most one event time.
EVERY_EVENT_S = 1e-7


def pressed_cluster():
    """Four replicas on two nodes of the 64-replica hour's setting: a load spike fills a small KV pool, drafts are
    offloaded under the planner, and reloaded when the load falls."""
    scenario = cluster_slice(load_scenario("cluster-4090-7b-64x-hour"), 4, 20.0)
    segments = [{"duration_s": 8.0, "rate_qps": 48.0}, {"duration_s": 12.0, "rate_qps": 4.0}]
    workload = scenario.workload.model_copy(update={"arrivals": PiecewiseArrivals(kind="piecewise", segments=segments)})
    return scenario.model_copy(
        update={
            "workload": workload,
            "engine": scenario.engine.model_copy(update={"num_kv_blocks": 600}),
            "memory": scenario.memory.model_copy(update={"replicas_per_node": 2, "min_resident": 1}),
        }
    )


def memory_record(result):
    return [(c.time_s, c.replica, c.state, c.num_kv_blocks_total) for c in result.memory.changes]


def test_a_two_process_run_synced_at_every_event_is_the_one_process_run():
    scenario = pressed_cluster()
    one = simulate(scenario, "adaptive", seed=0)
    two = simulate(scenario, "adaptive", seed=0, workers=2, sync_s=EVERY_EVENT_S)
    # The premise: drafts moved, so the planner's grants crossed between the processes.
    assert any(c.state is DraftState.OFFLOADING for c in one.memory.changes) and one.memory.reloads
    expected, got = summarize(one), summarize(two)
    assert {k: v for k, v in got.items() if k != "wall_s"} == {k: v for k, v in expected.items() if k != "wall_s"}
    for a, b in zip(one.replicas, two.replicas, strict=True):
        assert (a.series_time_s, a.series_k, a.series_running) == (b.series_time_s, b.series_k, b.series_running)
    for name in ("finish_s", "first_token_s", "num_output", "num_preemptions", "replica"):
        np.testing.assert_array_equal(getattr(two.table, name), getattr(one.table, name))
    assert memory_record(two) == memory_record(one)
    assert [(r.replica, r.wanted_s, r.resident_s) for r in two.memory.reloads] == [
        (r.replica, r.wanted_s, r.resident_s) for r in one.memory.reloads
    ]


def test_synced_within_its_shortest_step_a_run_without_draft_memory_routes_as_one_process():
    """The router sees each in-flight step's finishes at the step's end, so windows need only be shorter than a step
    for every request to land where one process sends it."""
    scenario = pressed_cluster()
    scenario = scenario.model_copy(update={"memory": scenario.memory.model_copy(update={"offload": False})})
    one = simulate(scenario, "adaptive", seed=0)
    sync_s = 0.02
    assert min(float(np.diff(r.series_time_s).min()) for r in one.replicas) > sync_s  # the premise
    with warnings.catch_warnings():
        warnings.simplefilter("error", ShortStepWarning)  # no step was shorter than a window: no warning
        two = simulate(scenario, "adaptive", seed=0, workers=2, sync_s=sync_s)
    np.testing.assert_array_equal(two.table.replica, one.table.replica)
    assert {k: v for k, v in summarize(two).items() if k != "wall_s"} == {
        k: v for k, v in summarize(one).items() if k != "wall_s"
    }


def test_a_coarse_sync_serves_every_request_once_and_repeats_itself():
    scenario = pressed_cluster()
    with pytest.warns(ShortStepWarning, match=r"sync_s=0.2: \d+ of \d+ steps were shorter"):
        first = simulate(scenario, "adaptive", seed=1, workers=2, sync_s=0.2)
    table = first.table
    assert not np.isnan(table.finish_s).any() and (table.num_output == table.output_tokens).all()
    assert set(table.replica.tolist()) == {0, 1, 2, 3}
    # Every token a replica emitted is in the table once: no request was served by two shards, none was dropped.
    assert sum(sum(r.series_tokens) for r in first.replicas) == int(table.num_output.sum())
    assert all(r.table is table for r in first.replicas)
    with pytest.warns(ShortStepWarning):
        again = simulate(scenario, "adaptive", seed=1, workers=2, sync_s=0.2)
    assert [r.series_time_s for r in again.replicas] == [r.series_time_s for r in first.replicas]
    assert memory_record(again) == memory_record(first)
    assert not multiprocessing.active_children()


def test_a_failing_worker_stops_the_run_with_its_error_and_leaves_no_process(monkeypatch):
    start_step = Replica.start_step

    def failing(self, now_s):
        if self.index == 3 and now_s > 2.0:
            raise RuntimeError("replica 3 broke")
        return start_step(self, now_s)

    monkeypatch.setattr(Replica, "start_step", failing)  # before the fork: the worker inherits it
    with pytest.raises(RuntimeError, match=r"(?s)worker for replicas 2-3 failed.*replica 3 broke"):
        simulate(pressed_cluster(), "fixed:k=2", seed=0, workers=2)
    assert not multiprocessing.active_children()


@pytest.mark.parametrize(
    ("change", "workers", "message"),
    [
        ({}, 3, r"workers=3: the scenario's 2 node\(s\) of 2 replica\(s\) take 1 to 2 workers"),
        ({}, 0, r"workers=0"),
        ({"scale_out": {"at_s": 5.0, "replicas": 2}}, 2, r"workers=2 cannot run a scale_out"),
    ],
)
def test_what_a_parallel_run_cannot_do_is_refused_before_it_starts(change, workers, message):
    scenario = pressed_cluster()
    scenario = type(scenario).model_validate({**scenario.model_dump(), **change})
    with pytest.raises(ScenarioError, match=message):
        simulate(scenario, "adaptive", seed=0, workers=workers)


def test_a_step_listener_is_refused_with_workers():
    with pytest.raises(ScenarioError, match="a step listener or an event trace"):
        simulate(pressed_cluster(), "adaptive", seed=0, on_step=lambda record, stats: None, workers=2)
