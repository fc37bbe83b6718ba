"""sim.cluster_slice: a cluster scenario on fewer replicas or for less time keeps its load per replica."""

from __future__ import annotations

import pytest

from specserve.sim import load_scenario, simulate
from specserve.sim.cluster_slice import cluster_slice
from specserve.sim.config import PiecewiseArrivals

HOUR = "cluster-4090-7b-64x-hour"


def _rates(scenario) -> list[tuple[float, float]]:
    """(duration s, QPS per replica) per segment, rounded off the scaling's last bits."""
    arrivals = scenario.workload.arrivals
    assert isinstance(arrivals, PiecewiseArrivals)
    return [(s.duration_s, round(s.rate_qps / scenario.num_replicas, 9)) for s in arrivals.segments]


def test_a_slice_keeps_the_per_replica_rates_and_the_floors_share() -> None:
    hour = load_scenario(HOUR)
    eight = cluster_slice(hour, 8)
    assert _rates(eight) == _rates(hour)
    assert eight.memory.min_resident / 8 == hour.memory.min_resident / hour.num_replicas
    assert eight.memory.replicas_per_node == min(hour.memory.replicas_per_node, 8)


def test_a_slice_cuts_the_arrivals_at_its_time() -> None:
    hour = load_scenario(HOUR)
    cut = cluster_slice(hour, hour.num_replicas, 100.0)
    assert sum(duration for duration, _ in _rates(cut)) == 100.0
    assert _rates(cut)[0] == _rates(hour)[0]
    assert _rates(cut)[-1][1] == _rates(hour)[1][1]


def test_one_replica_slice_serves_every_request_it_is_sent() -> None:
    result = simulate(cluster_slice(load_scenario(HOUR), 1, 20.0), "adaptive", seed=0)
    assert len(result.table.arrival_s) > 0
    assert (result.table.num_output == result.table.output_tokens).all()


def test_a_slice_keeps_the_share_of_replicas_a_scale_out_adds() -> None:
    scale_out = load_scenario("cluster-4090-7b-scale-out")
    assert scale_out.scale_out is not None
    eight = cluster_slice(scale_out, 8)
    assert eight.scale_out is not None
    assert eight.scale_out.replicas / 8 == scale_out.scale_out.replicas / scale_out.num_replicas
    # One replica serving and one joining at the least.
    two = cluster_slice(scale_out, 2)
    assert two.scale_out is not None and two.scale_out.replicas == 1
    with pytest.raises(ValueError, match="a scale-out needs at least 2 replicas, not 1"):
        cluster_slice(scale_out, 1)
