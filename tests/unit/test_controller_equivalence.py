"""The incremental controller decides as the one that re-planned the whole cluster at every push.

Seeded push sequences (replicas on shared nodes and in two deployments wanting reloads and offloads, grants
taken up or not, reload rates measured, replicas falling silent, leaving and coming back, policies set) replay
through both; every push must get the same directives (acceptance priors equal up to the rounding of running
sums), and the live replicas, the node bandwidths and the decision log must agree throughout. The incremental
controller answers at the push itself, as the old one did: there is no planning tick and no delay to allow for.
"""

from __future__ import annotations

import random

import pytest
from controller_per_push import PerPushControllerState
from telemetry_samples import engine_telemetry

from specserve.controller.state import ControllerState
from specserve.memory import ClusterMemoryParams
from specserve.messages import AcceptancePrior, DraftState, MemoryDecision, MemoryDirective, ReplicaSnapshot
from specserve.speculation.estimators.acceptance import pooled_evidence

STATES = (DraftState.RESIDENT, DraftState.OFFLOADED, DraftState.CONTRACTING, DraftState.RELOADING)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def random_snapshot(rng: random.Random, replica: str, granted: MemoryDecision | None) -> ReplicaSnapshot:
    state = rng.choice(STATES)
    width = rng.choice((3, 4))
    reached = tuple(rng.choice((0.0, rng.uniform(1, 100))) for _ in range(width))
    fields: dict[str, object] = dict(
        state=state,
        offload_wanted=state is DraftState.RESIDENT and rng.random() < 0.5,
        reload_wanted=state is DraftState.OFFLOADED and rng.random() < 0.7,
        # A grant handed out last push is taken up most of the time; sometimes the trigger let go in between.
        offload_granted=granted is MemoryDecision.GRANT_OFFLOAD and rng.random() < 0.7,
        reload_granted=granted is MemoryDecision.GRANT_RELOAD and rng.random() < 0.7,
        draft_bytes=rng.choice((10**9, 2 * 10**9)),
        num_running=rng.randrange(4),  # few values: ties in expected gain are ordered by replica id
        accepted_per_pos=tuple(r * rng.random() for r in reached),
        reached_per_pos=reached,
        num_reached_per_pos=(0,) * 4 if rng.random() < 0.6 else (5, 3, 1, 0),
    )
    if rng.random() < 0.3:
        fields.update(bytes_reloaded=rng.randrange(1, 4) * 10**9, reload_s=rng.uniform(0.02, 2.0))
    node = f"n{int(replica[1:]) % 3}"
    model = "m-even" if int(replica[1:]) % 2 == 0 else "m-odd"
    return ReplicaSnapshot(replica_id=replica, node_id=node, model_id=model, engine=engine_telemetry(**fields))


def same_directives(new: list, old: list) -> bool:
    if len(new) != len(old):
        return False
    for a, b in zip(new, old, strict=True):
        if isinstance(a, AcceptancePrior) and isinstance(b, AcceptancePrior):
            if a.num_replicas != b.num_replicas or a.accepted_per_pos != pytest.approx(b.accepted_per_pos):
                return False
            if a.reached_per_pos != pytest.approx(b.reached_per_pos):
                return False
        elif a != b:
            return False
    return True


@pytest.mark.parametrize(
    ("seed", "params"),
    [
        (0, ClusterMemoryParams()),
        (1, ClusterMemoryParams(max_concurrent_transfers=1, min_resident_per_deployment=2)),
        (2, ClusterMemoryParams(max_reload_s=0.05, min_resident_per_deployment=4)),
        (3, ClusterMemoryParams(max_concurrent_transfers=2, min_resident_per_deployment=1)),
    ],
)
def test_push_sequences_get_the_directives_of_planning_the_whole_cluster_at_every_push(seed, params):
    rng = random.Random(seed)
    clock = Clock()
    configured = {"n2": 40e9} if seed % 2 else None
    new = ControllerState(clock, stale_after_s=5.0, memory=params, node_bandwidth_bytes_per_s=configured)
    old = PerPushControllerState(clock, stale_after_s=5.0, memory=params, node_bandwidth_bytes_per_s=configured)
    replicas = [f"r{i}" for i in range(24)]
    last_grant: dict[str, MemoryDecision | None] = {}
    kinds_seen: set[str] = set()
    for _ in range(3000):
        clock.now += rng.choice((0.0, 0.01, 0.05, 0.3, 1.0)) if rng.random() < 0.995 else 6.0
        action = rng.random()
        replica = rng.choice(replicas[: rng.choice((8, 24))])  # a busy few and a quieter rest
        if action < 0.01:
            new.unregister(replica)
            old.unregister(replica)
            continue
        if action < 0.02:
            target = rng.choice((None, replica))
            policy = rng.choice(("fixed:k=1", "adaptive"))
            try:
                expected = old.set_policy(policy, target)
            except ValueError as e:
                with pytest.raises(ValueError, match="unknown replica"):
                    new.set_policy(policy, target)
                assert "unknown replica" in str(e)
                continue
            assert new.set_policy(policy, target) == expected
            continue
        snapshot = random_snapshot(rng, replica, last_grant.get(replica))
        got, expected = new.push(snapshot), old.push(snapshot)
        assert same_directives(got, expected), (clock.now, replica, got, expected)
        grants = [d.kind for d in got if isinstance(d, MemoryDirective) and d.kind.grants]
        last_grant[replica] = grants[0] if grants else None
        kinds_seen |= {type(d).__name__ for d in got} | {d.kind.value for d in got if isinstance(d, MemoryDirective)}
        if rng.random() < 0.05:
            assert [s.replica_id for s in new.replicas()] == [s.replica_id for s in old.replicas()]
            assert new.node_bandwidths() == pytest.approx(old.node_bandwidths())
    assert new.decision_counts == old.decision_counts
    assert list(new.decisions) == list(old.decisions)
    # The sequence exercised every kind of answer, or the comparison proved little.
    assert kinds_seen >= {"PolicyDirective", "AcceptancePrior", "grant_reload", "queue_reload", "grant_offload"}
    if params.min_resident_per_deployment:
        assert "refuse_offload" in kinds_seen


def test_the_simulators_pooled_prior_is_the_controllers():
    # The controller keeps the average as running sums push by push; the simulator pools at a scale-out's join.
    peers = [
        ((6.0, 3.0, 1.0), (10.0, 6.0, 3.0)),
        ((8.0, 4.0, 2.0, 1.0), (9.0, 8.0, 4.0, 2.0)),
        ((0.0,) * 3, (0.0,) * 3),
    ]
    state = ControllerState(Clock())
    for i, (accepted, reached) in enumerate(peers):
        state.push(evidence_snapshot(f"peer-{i}", accepted, reached))
    directives = state.push(evidence_snapshot("new", (), ()))
    (prior,) = [d for d in directives if isinstance(d, AcceptancePrior)]
    pooled = pooled_evidence(peers)
    assert pooled is not None and pooled[2] == prior.num_replicas == 2
    assert prior.accepted_per_pos == pytest.approx(pooled[0])
    assert prior.reached_per_pos == pytest.approx(pooled[1])


def evidence_snapshot(replica: str, accepted: tuple, reached: tuple) -> ReplicaSnapshot:
    engine = engine_telemetry(num_reached_per_pos=(0, 0, 0, 0), accepted_per_pos=accepted, reached_per_pos=reached)
    return ReplicaSnapshot(replica_id=replica, node_id="n", model_id="m", engine=engine)
