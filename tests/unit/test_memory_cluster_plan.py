"""The cluster memory planner: reload slots per node from bandwidth (Nightjar App. E), gain order, resident floor."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specserve.memory import ClusterMemoryParams, DraftState, ReplicaMemory, plan_cluster, transfer_slots
from specserve.messages import MemoryDecision

GIB = 1024**3
DRAFT = int(0.92 * GIB)
BANDWIDTH = {"n0": 23 * GIB, "n1": 23 * GIB}  # 40 ms per draft alone


def replica(name: str, node: str = "n0", state: DraftState = DraftState.OFFLOADED, gain: float = 1.0, **kw):
    base = ReplicaMemory(
        replica_id=name,
        node_id=node,
        deployment="d",
        state=state,
        offload_wanted=False,
        offload_granted=False,
        reload_wanted=state is DraftState.OFFLOADED,
        reload_granted=False,
        expected_gain=gain,
        draft_bytes=DRAFT,
    )
    return replace(base, **kw)


def kinds(directives) -> dict[str, str]:
    return {d.replica_id: d.kind.value for d in directives}


def test_worked_example_slots_follow_bandwidth_and_draft_size() -> None:
    params = ClusterMemoryParams(max_reload_s=0.1)
    assert transfer_slots(23 * GIB, DRAFT, params) == 2  # 40 ms alone, 80 ms two at a time
    assert transfer_slots(64 * GIB, DRAFT, params) == 6
    assert transfer_slots(1 * GIB, DRAFT, params) == 1  # one is always allowed
    assert transfer_slots(23 * GIB, DRAFT, ClusterMemoryParams(max_concurrent_transfers=3)) == 3


def test_four_reloads_on_one_node_are_granted_by_expected_gain_up_to_the_slots() -> None:
    replicas = [replica("a", gain=1.0), replica("b", gain=4.0), replica("c", gain=2.0), replica("d", gain=3.0)]
    directives = plan_cluster(replicas, BANDWIDTH, ClusterMemoryParams(max_reload_s=0.1))
    assert kinds(directives) == {"b": "grant_reload", "d": "grant_reload", "c": "queue_reload", "a": "queue_reload"}
    assert all(d.reason for d in directives)


def test_transfers_in_flight_hold_their_slots() -> None:
    replicas = [
        replica("busy", state=DraftState.RELOADING),
        replica("granted", reload_granted=True),
        replica("new", gain=9.0),
    ]
    directives = plan_cluster(replicas, BANDWIDTH, ClusterMemoryParams(max_reload_s=0.1))
    assert kinds(directives) == {"new": "queue_reload"}
    assert "2/2" in directives[0].reason


def test_nodes_have_their_own_links() -> None:
    replicas = [replica(f"a{i}", "n0") for i in range(3)] + [replica(f"b{i}", "n1") for i in range(3)]
    directives = plan_cluster(replicas, BANDWIDTH, ClusterMemoryParams(max_concurrent_transfers=1))
    granted = sorted(d.replica_id for d in directives if d.kind is MemoryDecision.GRANT_RELOAD)
    assert granted == ["a0", "b0"]


def test_a_node_without_a_bandwidth_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="n9"):
        plan_cluster([replica("a", node="n9")], BANDWIDTH, ClusterMemoryParams())


def test_offload_is_refused_when_it_would_break_the_deployments_floor() -> None:
    wanting = {"state": DraftState.RESIDENT, "reload_wanted": False, "offload_wanted": True}
    replicas = [replica("a", gain=2.0, **wanting), replica("b", gain=1.0, **wanting), replica("c", gain=3.0, **wanting)]
    directives = plan_cluster(replicas, BANDWIDTH, ClusterMemoryParams(min_resident_per_deployment=2))
    # The replica expecting least from its draft gives it up; the others keep the floor.
    assert kinds(directives) == {"b": "grant_offload", "a": "refuse_offload", "c": "refuse_offload"}
    assert "at least 2" in next(d.reason for d in directives if d.replica_id == "a")


def test_without_a_floor_every_offload_is_granted() -> None:
    wanting = {"state": DraftState.RESIDENT, "reload_wanted": False, "offload_wanted": True}
    replicas = [replica(n, **wanting) for n in "abc"]
    assert set(kinds(plan_cluster(replicas, BANDWIDTH, ClusterMemoryParams())).values()) == {"grant_offload"}


def test_params_reject_bad_values_naming_the_field() -> None:
    with pytest.raises(ValueError, match="max_concurrent_transfers"):
        ClusterMemoryParams(max_concurrent_transfers=0)
    with pytest.raises(ValueError, match="max_reload_s"):
        ClusterMemoryParams(max_reload_s=0)
