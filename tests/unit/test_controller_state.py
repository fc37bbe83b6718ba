"""The controller's bookkeeping with a fake clock (snapshots, ageing out, directives), and the engine
telemetry it is fed (messages that round-trip, counters whose reads change nothing)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from telemetry_samples import engine_telemetry

from specserve.controller.state import AUTO_BATCH_FROM_REPLICAS, AUTO_UNBATCH_BELOW_REPLICAS, ControllerState
from specserve.memory import ClusterMemoryParams
from specserve.messages import (
    BatchingDirective,
    DraftState,
    EngineTelemetry,
    MemoryDirective,
    PolicyDirective,
    ReplicaSnapshot,
)
from specserve.replicas.core.telemetry import MAX_RECENT_DURATIONS, StepCounters
from specserve.speculation import StepRecord


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def snapshot(replica: str, policy: str = "adaptive") -> ReplicaSnapshot:
    engine = engine_telemetry(spec=policy)
    return ReplicaSnapshot(replica_id=replica, node_id="n", model_id="m", engine=engine)


def test_keeps_the_latest_snapshot_per_replica_and_drops_silent_ones():
    clock = Clock()
    state = ControllerState(clock, stale_after_s=5.0)
    state.push(snapshot("b"))
    state.push(snapshot("a"))
    state.push(snapshot("a", policy="fixed:k=1"))
    assert [s.replica_id for s in state.replicas()] == ["a", "b"]
    assert state.replicas()[0].engine.policy.spec == "fixed:k=1"
    clock.now = 4.0
    state.push(snapshot("a"))
    clock.now = 6.0
    assert [s.replica_id for s in state.replicas()] == ["a"]


def test_directives_reach_their_replica_once():
    state = ControllerState(Clock())
    state.push(snapshot("a"))
    state.push(snapshot("b"))
    assert state.set_policy("fixed:k=2", "a") == ["a"]
    assert state.push(snapshot("a")) == [PolicyDirective("fixed:k=2")]
    assert state.push(snapshot("a")) == []
    assert state.push(snapshot("b")) == []


def test_cluster_wide_policy_also_reaches_replicas_that_join_later():
    state = ControllerState(Clock())
    state.push(snapshot("a"))
    assert state.set_policy("fixed:k=1") == ["a"]
    assert state.push(snapshot("a")) == [PolicyDirective("fixed:k=1")]
    assert state.push(snapshot("new")) == [PolicyDirective("fixed:k=1")]


def test_unknown_replica_is_an_error_naming_it():
    state = ControllerState(Clock())
    state.push(snapshot("a"))
    with pytest.raises(ValueError, match="unknown replica 'ghost'.*a"):
        state.set_policy("fixed:k=1", "ghost")


def test_engine_telemetry_round_trips_through_a_dict_of_plain_types():
    engine = engine_telemetry(
        state=DraftState.OFFLOADED, errors={"choose": 2}, info={"alpha": 0.5}, failed_checks=("k_honoured",)
    )
    # JSON keeps what msgpack keeps: dicts, lists (no tuples), strings (no enums), numbers.
    assert EngineTelemetry.from_dict(json.loads(json.dumps(engine.to_dict()))) == engine
    without_draft = engine_telemetry(draft_memory=None)
    assert EngineTelemetry.from_dict(json.loads(json.dumps(without_draft.to_dict()))) == without_draft


def test_acceptance_is_unknown_until_a_draft_is_verified():
    engine = snapshot("a").engine
    assert engine.acceptance == 0.6
    fresh = engine_telemetry(num_reached_per_pos=(0, 0, 0, 0))
    assert fresh.acceptance is None


def test_a_replica_that_unregisters_is_gone_at_once():
    state = ControllerState(Clock())
    state.push(snapshot("a"))
    state.push(snapshot("b"))
    state.unregister("a")
    state.unregister("never-seen")
    assert [s.replica_id for s in state.replicas()] == ["b"]


def step(duration_s: float, k: int = 0) -> StepRecord:
    return StepRecord(
        now_s=0.0,
        k=k,
        duration_s=duration_s,
        num_running=1,
        num_context_tokens=8,
        num_batched_tokens=1,
        num_draft_passes=1,
        num_emitted_tokens=1,
    )


def test_reading_step_durations_takes_nothing_from_another_reader():
    counters = StepCounters(max_k=2)
    for duration in (0.1, 0.2, 0.3):
        counters.add(step(duration))
    first = counters.durations_since(0)
    assert counters.durations_since(0) == first == (0.1, 0.2, 0.3)
    assert counters.durations_since(2) == (0.3,)
    counters.add(step(0.4))
    # Each reader passes the step count it has seen and gets exactly the steps after it.
    assert counters.durations_since(3) == (0.4,)
    assert counters.durations_since(1) == (0.2, 0.3, 0.4)
    assert counters.durations_since(4) == counters.durations_since(9) == ()


def test_a_reader_far_behind_gets_the_latest_durations_only():
    counters = StepCounters(max_k=1)
    for index in range(MAX_RECENT_DURATIONS + 10):
        counters.add(step(float(index)))
    durations = counters.durations_since(0)
    assert len(durations) == MAX_RECENT_DURATIONS
    assert durations[-1] == counters.num_steps - 1


def memory_snapshot(replica: str, node: str = "n1", **engine: object) -> ReplicaSnapshot:
    fields = dict(state=DraftState.OFFLOADED, reload_wanted=True, draft_bytes=10**9, num_running=4)
    fields.update(engine)
    return ReplicaSnapshot(replica_id=replica, node_id=node, model_id="m", engine=engine_telemetry(**fields))


def kinds(directives) -> list[str]:
    return [d.kind.value for d in directives if isinstance(d, MemoryDirective)]


def test_reloads_on_one_node_take_turns_and_a_grant_holds_its_slot_until_the_replica_reports_it():
    state = ControllerState(Clock(), memory=ClusterMemoryParams(max_concurrent_transfers=1))
    assert kinds(state.push(memory_snapshot("a"))) == ["grant_reload"]
    # b pushes before a has reported its grant: the slot is a's all the same.
    assert kinds(state.push(memory_snapshot("b"))) == ["queue_reload"]
    assert kinds(state.push(memory_snapshot("c", node="n2"))) == ["grant_reload"], "another node, another link"
    state.push(memory_snapshot("a", state=DraftState.CONTRACTING, reload_wanted=False))
    assert kinds(state.push(memory_snapshot("b"))) == ["queue_reload"], "a's transfer is in flight"
    state.push(memory_snapshot("a", state=DraftState.RESIDENT, reload_wanted=False))
    assert kinds(state.push(memory_snapshot("b"))) == ["grant_reload"]
    assert state.decision_counts == {"grant_reload": 3, "queue_reload": 2}
    assert [d[2] for d in state.decisions][:2] == ["grant_reload", "queue_reload"]
    assert all(reason for *_, reason in state.decisions), "every decision says why"


def test_offloads_keep_the_deployments_floor_of_resident_drafts():
    state = ControllerState(Clock(), memory=ClusterMemoryParams(min_resident_per_deployment=1))
    resident = dict(state=DraftState.RESIDENT, reload_wanted=False)
    assert kinds(state.push(memory_snapshot("a", **resident, offload_wanted=True))) == ["refuse_offload"], "alone"
    state.push(memory_snapshot("b", **resident))
    assert kinds(state.push(memory_snapshot("a", **resident, offload_wanted=True))) == ["grant_offload"]
    # a's grant counts before a reports it: b's draft is now the deployment's last resident one.
    assert kinds(state.push(memory_snapshot("b", **resident, offload_wanted=True))) == ["refuse_offload"]


def test_replicas_that_want_nothing_get_no_memory_directive():
    state = ControllerState(Clock())
    assert kinds(state.push(memory_snapshot("a", state=DraftState.RESIDENT, reload_wanted=False))) == []


def test_a_restarted_controller_hands_the_cluster_policy_to_every_replica_again():
    before = ControllerState(Clock())
    before.push(snapshot("a"))
    before.set_policy("fixed:k=2")
    after = ControllerState(Clock())
    after.restore(before.cluster_policy)
    assert after.push(snapshot("a")) == [PolicyDirective("fixed:k=2")]
    assert after.push(snapshot("a")) == []


def test_a_grant_that_did_not_take_is_planned_again_at_the_replicas_next_push():
    # The trigger let go between the snapshot and the grant's arrival, then held again: the replica reports the
    # want without the grant. Remembering the grant until it showed up would leave the draft offloaded for good.
    state = ControllerState(Clock(), memory=ClusterMemoryParams(max_concurrent_transfers=1))
    assert kinds(state.push(memory_snapshot("a"))) == ["grant_reload"]
    assert kinds(state.push(memory_snapshot("b"))) == ["queue_reload"], "a's grant holds the slot until a pushes"
    assert kinds(state.push(memory_snapshot("a"))) == ["grant_reload"]
    assert kinds(state.push(memory_snapshot("a", reload_granted=True))) == [], "taken up: nothing more to grant"
    assert kinds(state.push(memory_snapshot("b"))) == ["queue_reload"], "a's reload is in flight"


def test_a_nodes_measured_reload_rate_replaces_the_default_bandwidth_and_sets_its_transfer_slots():
    # 1 GB drafts; a reload should take at most 0.1 s at its share of the link (ClusterMemoryParams' default).
    state = ControllerState(Clock())
    # n1 has reloaded a draft at 0.5 GB/s (2 s for 1 GB): one transfer at a time; n2 has not: 25 GB/s, 2 slots.
    state.push(
        memory_snapshot(
            "done", node="n1", state=DraftState.RESIDENT, reload_wanted=False, bytes_reloaded=10**9, reload_s=2.0
        )
    )
    assert state.node_bandwidths() == {"n1": 0.5e9}
    assert kinds(state.push(memory_snapshot("a", node="n1"))) == ["grant_reload"]
    assert kinds(state.push(memory_snapshot("b", node="n1"))) == ["queue_reload"]
    assert kinds(state.push(memory_snapshot("c", node="n2"))) == ["grant_reload"]
    assert kinds(state.push(memory_snapshot("d", node="n2"))) == ["grant_reload"]
    assert kinds(state.push(memory_snapshot("e", node="n2"))) == ["queue_reload"]
    assert state.node_bandwidths() == {"n1": 0.5e9, "n2": 25e9}
    assert "0.5 GB/s" in state.decisions[0][3]


def test_configured_bandwidth_wins_over_the_measured_one():
    state = ControllerState(Clock(), node_bandwidth_bytes_per_s={"n1": 40e9})
    state.push(
        memory_snapshot(
            "done", node="n1", state=DraftState.RESIDENT, reload_wanted=False, bytes_reloaded=10**9, reload_s=2.0
        )
    )
    assert state.node_bandwidths() == {"n1": 40e9}


def test_auto_batching_is_answered_from_the_clusters_size_with_a_gap_against_flapping():
    state = ControllerState(Clock(), stale_after_s=10.0)

    def batching(snapshot) -> list[BatchingDirective]:
        return [d for d in state.push(snapshot) if isinstance(d, BatchingDirective)]

    direct = [replace(snapshot(f"r{i:04d}"), batching_node=False) for i in range(AUTO_BATCH_FROM_REPLICAS)]
    for s in direct[:-1]:
        assert batching(s) == [], "a small cluster pushes directly"
    (moved,) = batching(direct[-1])
    assert moved.node and moved.num_replicas == AUTO_BATCH_FROM_REPLICAS
    # A replica in a fixed mode is never told; one already batched is left alone.
    assert batching(replace(snapshot("fixed"), batching_node=None)) == []
    batched = [replace(s, batching_node=True) for s in direct]
    assert all(batching(s) == [] for s in batched)
    # The cluster shrinks: batched replicas stay batched down to the lower threshold, then go direct.
    for s in batched[AUTO_UNBATCH_BELOW_REPLICAS:]:
        state.unregister(s.replica_id)
    state.unregister("fixed")
    assert batching(batched[0]) == [], "between the thresholds nothing moves"
    state.unregister(batched[AUTO_UNBATCH_BELOW_REPLICAS - 1].replica_id)
    (back,) = batching(batched[1])
    assert not back.node and back.num_replicas < AUTO_UNBATCH_BELOW_REPLICAS
