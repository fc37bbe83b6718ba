"""A scale-out in the simulator: replicas that join the router during the run, seeded with their peers' acceptance
evidence as the controller seeds a replica new to its deployment, or cold."""

from __future__ import annotations

import pytest
from sim_helpers import small_scenario

from specserve.sim import ScenarioError, simulate

JOIN_S = 10.0


def scale_out_run(priors: bool):
    scenario = small_scenario(
        num_replicas=4,
        engine={"max_k": 8},
        acceptance={"mean": 0.9},
        workload={"arrivals": {"kind": "poisson", "rate_qps": 24, "duration_s": 20}},
        scale_out={"at_s": JOIN_S, "replicas": 2, "priors": priors},
    )
    return simulate(scenario, "adaptive", seed=1)


def first_decode_k(replica) -> int:
    return next(k for k in replica.series_k if k > 0)


def test_new_replicas_get_requests_only_from_when_they_join():
    result = scale_out_run(priors=True)
    serving, joining = result.replicas[:2], result.replicas[2:]
    assert all(r.series_time_s[0] < JOIN_S for r in serving)
    assert all(r.series_time_s and r.series_time_s[0] >= JOIN_S for r in joining)


def test_new_replicas_seeded_with_their_peers_evidence_start_where_the_peers_are_and_cold_ones_below():
    seeded, cold = scale_out_run(priors=True), scale_out_run(priors=False)
    assert cold.scale_out_prior is None
    accepted, reached, peers = seeded.scale_out_prior
    assert peers == 2
    # Position 0's pooled rate is the peers' measured acceptance, near the scenario's 0.9, not the cold prior's 0.5.
    assert accepted[0] / reached[0] > 0.8
    for with_prior, without in zip(seeded.replicas[2:], cold.replicas[2:], strict=True):
        assert first_decode_k(with_prior) > first_decode_k(without), "the cold prior (0.5) starts lower"
    # The replicas serving from the start ran the same either way until the join.
    for a, b in zip(seeded.replicas[:2], cold.replicas[:2], strict=True):
        before = sum(t < JOIN_S for t in a.series_time_s)
        assert a.series_k[:before] == b.series_k[:before]


def test_a_scale_out_of_every_replica_is_refused_naming_the_key():
    with pytest.raises(ScenarioError, match="scale_out.replicas=4 must be fewer than num_replicas=4"):
        small_scenario(num_replicas=4, scale_out={"at_s": 5, "replicas": 4})
