"""A cluster scenario cut down to fewer replicas or a shorter time, at the same load per replica.

A scenario's rates are its cluster's (the router spreads them over ``num_replicas``). Rehearsing a 64-replica hour
on one, eight or all replicas, or for its first minutes, needs the same per-replica load: the rates scale with the
replicas, a node keeps at most its replicas, and the floor of resident drafts keeps its share of the fleet.
"""

from __future__ import annotations

from specserve.sim.config import PiecewiseArrivals, PoissonArrivals, Scenario


def cluster_slice(scenario: Scenario, num_replicas: int, duration_s: float | None = None) -> Scenario:
    """``scenario`` on ``num_replicas`` replicas at its per-replica rates, its arrivals cut at ``duration_s``."""
    arrivals = scenario.workload.arrivals
    factor = num_replicas / scenario.num_replicas
    if isinstance(arrivals, PiecewiseArrivals):
        segments, start_s = [], 0.0
        for segment in arrivals.segments:
            if duration_s is not None and start_s >= duration_s:
                break
            length_s = segment.duration_s if duration_s is None else min(segment.duration_s, duration_s - start_s)
            segments.append(segment.model_copy(update={"rate_qps": segment.rate_qps * factor, "duration_s": length_s}))
            start_s += segment.duration_s
        arrivals = arrivals.model_copy(update={"segments": segments})
    elif isinstance(arrivals, PoissonArrivals):
        length_s = arrivals.duration_s if duration_s is None else min(arrivals.duration_s, duration_s)
        arrivals = arrivals.model_copy(update={"rate_qps": arrivals.rate_qps * factor, "duration_s": length_s})
    else:
        raise ValueError(f"cluster_slice scales poisson and piecewise arrivals, not {arrivals.kind!r}")
    memory = scenario.memory.model_copy(
        update={
            "replicas_per_node": min(scenario.memory.replicas_per_node, num_replicas),
            "min_resident": round(scenario.memory.min_resident * factor),
        }
    )
    workload = scenario.workload.model_copy(update={"arrivals": arrivals})
    update = {"num_replicas": num_replicas, "workload": workload, "memory": memory}
    if scenario.scale_out is not None:
        # The same share of the fleet joins; at least one replica joins and at least one serves from the start.
        joining = min(max(1, round(scenario.scale_out.replicas * factor)), num_replicas - 1)
        if joining < 1:
            raise ValueError(f"cluster_slice: a scale-out needs at least 2 replicas, not {num_replicas}")
        update["scale_out"] = scenario.scale_out.model_copy(update={"replicas": joining})
    return scenario.model_copy(update=update)
