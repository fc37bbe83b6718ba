"""A new replica starts from its deployment's acceptance evidence: the estimator takes peers' decayed counts,
the controller averages them over the deployment's replicas and hands them to a replica that has verified no
draft, and the policies that keep a per-position acceptance estimate start from it."""

from __future__ import annotations

import pytest
from telemetry_samples import engine_telemetry

from specserve.controller.state import ControllerState
from specserve.messages import AcceptancePrior, PolicyDirective, ReplicaSnapshot
from specserve.speculation import EngineTraits, make_policy
from specserve.speculation.estimators.acceptance import PositionAcceptance

# A peer that has verified many drafts at a conditional acceptance of 0.9 per position.
HIGH = {
    "accepted_per_pos": (90.0, 81.0, 72.9, 65.6),
    "reached_per_pos": (100.0, 90.0, 81.0, 72.9),
}
LOW = {
    "accepted_per_pos": (30.0, 9.0, 2.7, 0.8),
    "reached_per_pos": (100.0, 30.0, 9.0, 2.7),
}
FRESH = {"num_reached_per_pos": (0, 0, 0, 0), "num_accepted_per_pos": (0, 0, 0, 0), "num_drafted_per_pos": (0, 0, 0, 0)}


def snapshot(replica: str, model: str = "m", **engine) -> ReplicaSnapshot:
    return ReplicaSnapshot(replica_id=replica, node_id="n", model_id=model, engine=engine_telemetry(**engine))


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_seeded_evidence_sets_the_estimate_and_later_steps_outweigh_it():
    estimator = PositionAcceptance(max_k=4)
    assert estimator.alphas() == [0.5] * 4
    estimator.seed(HIGH["accepted_per_pos"], HIGH["reached_per_pos"])
    assert estimator.alphas() == pytest.approx([0.9] * 4, abs=0.01)
    assert estimator.num_reached() == list(HIGH["reached_per_pos"])


def test_seed_takes_what_fits_and_refuses_impossible_counts():
    estimator = PositionAcceptance(max_k=2)
    estimator.seed((9.0, 8.0, 7.0), (10.0, 9.0, 8.0))  # a peer with a longer max_k: its deep positions dropped
    assert estimator.num_reached() == [10.0, 9.0]
    for accepted, reached in (((5.0,), (4.0,)), ((-1.0,), (4.0,)), ((float("nan"),), (4.0,)), ((1.0, 1.0), (2.0,))):
        with pytest.raises(ValueError):
            PositionAcceptance(max_k=2).seed(accepted, reached)


def test_a_new_replica_gets_the_average_of_its_deployments_evidence_after_its_policy():
    state = ControllerState(Clock())
    state.push(snapshot("a", **HIGH))
    state.push(snapshot("b", **LOW))
    state.push(snapshot("other", model="another-model", **LOW))  # another (target, draft) pair: not a peer
    state.set_policy("goodput")
    directives = state.push(snapshot("new", **FRESH))
    assert directives[0] == PolicyDirective("goodput")
    (prior,) = [d for d in directives if isinstance(d, AcceptancePrior)]
    assert prior.num_replicas == 2
    assert prior.accepted_per_pos == pytest.approx((60.0, 45.0, 37.8, 33.2))
    assert prior.reached_per_pos == pytest.approx((100.0, 60.0, 45.0, 37.8))
    assert not [d for d in state.push(snapshot("new", **FRESH)) if isinstance(d, AcceptancePrior)], "once"


def test_no_prior_without_peer_evidence_or_for_a_replica_with_its_own():
    state = ControllerState(Clock())
    state.push(snapshot("a", **FRESH))  # no peer has verified a draft yet
    assert not [d for d in state.push(snapshot("b", **FRESH)) if isinstance(d, AcceptancePrior)]
    state.push(snapshot("c", **HIGH))
    # A replica the controller meets for the first time after it has drafted (a controller restart) keeps its own.
    assert not [d for d in state.push(snapshot("d", **LOW)) if isinstance(d, AcceptancePrior)]


@pytest.mark.parametrize("spec", ["goodput", "adaptive"])
def test_policies_with_an_acceptance_estimate_start_from_the_prior(spec):
    cold, seeded = (make_policy(spec, EngineTraits(max_k=4)) for _ in range(2))
    seeded.seed_acceptance(HIGH["accepted_per_pos"], HIGH["reached_per_pos"])
    assert cold.describe()["alpha_0"] == pytest.approx(0.5)
    assert seeded.describe()["alpha_0"] == pytest.approx(0.9, abs=0.01)
    assert seeded.describe()["alpha_3"] == pytest.approx(0.9, abs=0.01)


def test_policies_without_one_ignore_it():
    for spec in ("fixed:k=2", "bandit", "ucb", "static-table"):
        policy = make_policy(spec, EngineTraits(max_k=4))
        before = policy.describe()
        policy.seed_acceptance(HIGH["accepted_per_pos"], HIGH["reached_per_pos"])
        assert policy.describe() == before
