"""Request routing in the simulator (specserve.sim.routing): the speculation-aware rule on stand-in replicas, the
batch stream that classes requests, and the kernel's router on real runs (the default changes nothing)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specserve.sim import ScenarioError, parse_scenario
from specserve.sim.config import RouterConfig
from specserve.sim.routing import Route, Router, least_outstanding, speculation_aware
from specserve.sim.runner import simulate
from specserve.sim.workload import build_workload


@dataclass
class Stub:
    """What the rule reads of a replica."""

    num_outstanding: int
    draft_resident: bool = True
    kv_expanded: bool = False


def offloaded(load: int) -> Stub:
    return Stub(load, draft_resident=False, kv_expanded=True)


def moving(load: int) -> Stub:
    """A draft in flight (offloading, contracting, reloading): neither resident nor with an expanded pool."""
    return Stub(load, draft_resident=False, kv_expanded=False)


# -- the rule --------------------------------------------------------------------------------------------------


def test_latency_sensitive_requests_go_to_the_least_loaded_resident_replica() -> None:
    replicas = [offloaded(1), Stub(5), Stub(3), offloaded(0)]
    chosen, route = speculation_aware(replicas, batch=False, max_imbalance=8)
    assert chosen is replicas[2] and route is Route.DIVERTED
    assert least_outstanding(replicas) is replicas[3]  # the default would have sent it to an offloaded replica


def test_batch_requests_go_to_the_least_loaded_offloaded_replica() -> None:
    replicas = [Stub(0), offloaded(6), offloaded(4), Stub(1)]
    chosen, route = speculation_aware(replicas, batch=True, max_imbalance=8)
    assert chosen is replicas[2] and route is Route.DIVERTED


def test_the_preferred_replica_that_is_also_least_loaded_is_no_diversion() -> None:
    replicas = [offloaded(4), Stub(2), Stub(3)]
    assert speculation_aware(replicas, batch=False, max_imbalance=0) == (replicas[1], Route.PREFERRED)


@pytest.mark.parametrize("batch", [False, True])
def test_without_a_replica_of_the_preferred_kind_it_falls_back_to_least_outstanding(batch: bool) -> None:
    # Latency-sensitive: every draft away; batch: every draft resident. A moving draft qualifies for neither.
    replicas = [offloaded(3), moving(1), offloaded(2)] if not batch else [Stub(3), moving(1), Stub(2)]
    assert speculation_aware(replicas, batch, max_imbalance=100) == (replicas[1], Route.NO_CANDIDATE)


def test_the_imbalance_bound_sends_the_request_to_the_least_loaded_replica() -> None:
    replicas = [Stub(10), offloaded(2)]
    # The resident replica holds 8 more than the least-loaded one: within a bound of 8, past a bound of 7.
    assert speculation_aware(replicas, batch=False, max_imbalance=8) == (replicas[0], Route.DIVERTED)
    assert speculation_aware(replicas, batch=False, max_imbalance=7) == (replicas[1], Route.IMBALANCE)
    jobs = [Stub(0), offloaded(1), offloaded(5)]
    assert speculation_aware(jobs, batch=True, max_imbalance=0) == (jobs[0], Route.IMBALANCE)
    assert speculation_aware(jobs, batch=True, max_imbalance=1) == (jobs[1], Route.DIVERTED)


def test_the_bound_keeps_every_replica_fed() -> None:
    """Latency-sensitive requests only, one replica's draft away for good: the rule keeps sending it work once the
    resident ones are max_imbalance ahead, so the gap never exceeds the bound (plus the request in hand)."""
    replicas = [Stub(0), Stub(0), offloaded(0)]
    for _ in range(300):
        chosen, _ = speculation_aware(replicas, batch=False, max_imbalance=4)
        chosen.num_outstanding += 1
        loads = [r.num_outstanding for r in replicas]
        assert max(loads) - min(loads) <= 4 + 1
    assert replicas[2].num_outstanding >= 300 // 3 - 4


def test_ties_go_to_the_lowest_index_as_least_outstanding_does() -> None:
    replicas = [offloaded(1), Stub(2), Stub(2)]
    assert speculation_aware(replicas, batch=False, max_imbalance=8)[0] is replicas[1]
    pair = [Stub(2), Stub(2)]
    assert least_outstanding(pair) is pair[0]


def test_the_router_counts_routes_per_class() -> None:
    classes = np.array([False, True, False])
    router = Router(RouterConfig(kind="speculation_aware", max_imbalance=8), classes)
    replicas = [offloaded(0), Stub(1)]
    assert [router.route(i, replicas) for i in range(3)] == [replicas[1], replicas[0], replicas[1]]
    assert router.counts == {("latency", "diverted"): 2, ("batch", "preferred"): 1}
    assert router.matched == {"latency": 2, "batch": 1}
    default = Router(RouterConfig(), classes)
    assert [default.route(i, replicas) for i in range(3)] == [replicas[0]] * 3
    assert default.counts == {("latency", "least_outstanding"): 2, ("batch", "least_outstanding"): 1}


# -- the scenario key and the batch stream ----------------------------------------------------------------------


def raw_scenario(**overrides: Any) -> dict:
    raw: dict[str, Any] = {
        "name": "routing",
        "hardware": "rtx4090",
        "pair": "deepseek-r1-distill-qwen-7b+0.5b",
        "engine": {"max_k": 4, "num_kv_blocks": 1200, "max_model_len": 1024, "k0_runs_draft_pass": False},
        "workload": {
            "lengths": {
                "prompt_tokens": {"mean": 200, "std": 100, "max_tokens": 600},
                "output_tokens": {"mean": 150, "std": 80, "max_tokens": 400},
            },
            "arrivals": {"kind": "poisson", "rate_qps": 4, "duration_s": 6},
        },
        "acceptance": {"mean": 0.66},
    }
    raw.update(overrides)
    return raw


BATCH_STREAM = {
    "lengths": {
        "prompt_tokens": {"mean": 400, "std": 100, "max_tokens": 600},
        "output_tokens": {"mean": 300, "std": 80, "max_tokens": 400},
    },
    "arrivals": {"kind": "poisson", "rate_qps": 1, "duration_s": 6},
}


def test_router_key_defaults_to_least_outstanding_and_takes_a_bare_kind() -> None:
    assert parse_scenario(raw_scenario()).router == RouterConfig(kind="least_outstanding")
    assert parse_scenario(raw_scenario(router="speculation_aware")).router.kind == "speculation_aware"
    full = parse_scenario(raw_scenario(router={"kind": "speculation_aware", "max_imbalance": 3}))
    assert full.router == RouterConfig(kind="speculation_aware", max_imbalance=3)
    with pytest.raises(ScenarioError, match="router"):
        parse_scenario(raw_scenario(router="round_robin"))


def test_the_batch_stream_adds_requests_and_leaves_the_first_streams_draws_alone() -> None:
    plain = parse_scenario(raw_scenario()).workload
    mixed = parse_scenario(raw_scenario(workload={**raw_scenario()["workload"], "batch": BATCH_STREAM})).workload
    one = build_workload(plain, Path.cwd(), 1024, np.random.default_rng(5))
    both = build_workload(mixed, Path.cwd(), 1024, np.random.default_rng(5))
    assert one.batch is None and not one.is_batch().any()
    flags = both.is_batch()
    assert flags.any() and (~flags).any()
    assert (np.diff(both.arrival_s) >= 0).all()
    # The latency-sensitive requests are exactly the workload without a batch stream.
    for name in ("arrival_s", "prompt_tokens", "output_tokens"):
        np.testing.assert_array_equal(getattr(both, name)[~flags], getattr(one, name))
    assert both.output_tokens[flags].mean() > both.output_tokens[~flags].mean()


def test_a_batch_stream_from_a_trace_is_read_relative_to_the_scenario_file(tmp_path: Path) -> None:
    from specserve.sim.scenario import load_scenario

    (tmp_path / "jobs.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0.5,100,50\n0.1,80,40\n")
    (tmp_path / "s.yaml").write_text(
        "hardware: rtx4090\npair: deepseek-r1-distill-qwen-7b+0.5b\nacceptance: {mean: 0.6}\n"
        "workload:\n  arrivals: {kind: poisson, rate_qps: 1, duration_s: 1}\n"
        "  batch: {arrivals: {kind: trace, path: jobs.csv}}\n"
    )
    scen = load_scenario(str(tmp_path / "s.yaml"))
    assert scen.workload.batch is not None
    assert scen.workload.batch.arrivals.path == str(tmp_path / "jobs.csv")  # type: ignore[union-attr]
    result = simulate(scen, "fixed:k=2", seed=0)
    assert result.table.batch.sum() == 2


# -- the kernel's router ------------------------------------------------------------------------------------------


def summary(result) -> tuple:
    t = result.table
    return (result.end_s, t.replica.tolist(), t.first_token_s.tolist(), t.finish_s.tolist())


def test_without_offload_speculation_aware_routes_as_least_outstanding() -> None:
    """No draft ever leaves: every replica is resident, none expanded, so each choice is the default's."""
    raw = raw_scenario(num_replicas=3, workload={**raw_scenario()["workload"], "batch": BATCH_STREAM})
    least = simulate(parse_scenario(raw), "adaptive", seed=2)
    aware = simulate(parse_scenario({**raw, "router": "speculation_aware"}), "adaptive", seed=2)
    assert summary(aware) == summary(least)
    assert aware.router is not None
    assert {how for _, how in aware.router.counts} == {"preferred", "no_candidate"}


class RecordingRouter(Router):
    """The kernel's router, noting the replicas' state at every choice."""

    seen: list[tuple[bool, list[tuple[int, bool, bool]], int]] = []

    def route(self, request, replicas):  # type: ignore[no-untyped-def]
        state = [(r.num_outstanding, r.draft_resident, r.kv_expanded) for r in replicas]
        chosen = super().route(request, replicas)
        RecordingRouter.seen.append((bool(self.batch[request]), state, chosen.index))
        return chosen


def test_on_a_run_that_offloads_the_rule_reads_the_replicas_residency(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two replicas, the planner keeping one draft resident, a burst that makes the other offload: batch requests
    reach the expanded replica and latency-sensitive ones the resident one, each within the bound."""
    import specserve.sim.kernel as kernel

    monkeypatch.setattr(kernel, "Router", RecordingRouter)
    RecordingRouter.seen = []
    workload = {
        **raw_scenario()["workload"],
        "arrivals": {
            "kind": "burst",
            "base_qps": 2,
            "peak_qps": 40,
            "burst_start_s": 3,
            "burst_duration_s": 6,
            "duration_s": 16,
        },
        "batch": {**BATCH_STREAM, "arrivals": {"kind": "poisson", "rate_qps": 2, "duration_s": 16}},
    }
    raw = raw_scenario(
        num_replicas=2,
        workload=workload,
        memory={"offload": True, "coordination": "planner", "min_resident": 1},
        router={"kind": "speculation_aware", "max_imbalance": 4},
    )
    # bandit, as in test_sim_memory: on this small pool it keeps k = 0 under the burst, so the draft leaves.
    result = simulate(parse_scenario(raw), "bandit", seed=0)
    assert result.memory is not None and result.memory.changes
    seen = RecordingRouter.seen
    assert len(seen) == len(result.table.arrival_s)
    mixed = [s for s in seen if any(e for _, _, e in s[1]) and any(r for _, r, _ in s[1])]
    assert mixed  # the fleet was mixed at some arrivals
    for batch, state, chosen in mixed:
        loads = [n for n, _, _ in state]
        want = [i for i, (_, resident, expanded) in enumerate(state) if (expanded if batch else resident)]
        best = min(want, key=lambda i: (loads[i], i))
        expected = best if loads[best] - min(loads) <= 4 else loads.index(min(loads))
        assert chosen == expected
    assert any(batch and state[chosen][2] for batch, state, chosen in mixed)
    assert any(not batch and state[chosen][1] for batch, state, chosen in mixed)
    assert np.isfinite(result.table.finish_s).all()
