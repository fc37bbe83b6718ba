"""Cluster tier: the multi-node cluster of `test_multinode.py` in Ray Serve's throughput-optimized mode with its
HAProxy ingress, switched on as docs/deployment/cluster.md says for a joined cluster:
`RAY_SERVE_THROUGHPUT_OPTIMIZED=1` and
`RAY_SERVE_ENABLE_HA_PROXY=1` in the environment of every node's `ray start`. HAProxy on the head takes HTTP and
hands each request to a replica's own HTTP port on a worker node (Serve's direct ingress). Then a worker fails
under load and a new one joins, as in the default mode. One cluster for the module: the tests run in order."""

from __future__ import annotations

import pytest
from closed_loop import Load
from multinode import assert_dead_engine_errors, joined_cluster
from ray_nodes import ray_env

from specserve.cluster.local import SERVE_SWITCHES

# `make test-slow`'s (CI time: about 4 min with its three-node cluster): the default-proxy cluster of
# test_multinode.py runs in CI, and test_throughput_mode.py serves through the HAProxy ingress on one node.
pytestmark = pytest.mark.slow


def emitted(replicas: list[dict]) -> dict[str, int]:
    return {r["replica_id"]: r["engine"]["num_emitted_tokens"] for r in replicas}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, trained_pair):
    tmp = tmp_path_factory.mktemp("multinode-haproxy")
    env = dict(ray_env(tmp), **{variable: "1" for variable in SERVE_SWITCHES.values()})
    with joined_cluster(tmp, env, workers=2) as cluster:
        cluster.endpoint = cluster.server.wait_endpoint(timeout_s=900)
        yield cluster


def test_haproxy_on_the_head_spreads_requests_over_both_workers(cluster):
    assert cluster.head.descendants_named("haproxy"), "HAProxy serves HTTP on the head"
    assert not any(w.descendants_named("haproxy") for w in cluster.workers), "proxy_location: HeadOnly"
    before = emitted(cluster.wait_replicas(lambda rs: len(rs) == 2, timeout_s=60))
    with Load(cluster.endpoint, clients=4) as load:
        load.wait_answered(24)
    assert all(o.ok for o in load.outcomes), [(o.status, o.detail[:200]) for o in load.outcomes if not o.ok]
    # Telemetry is pushed every second or so: wait for both engines to report the tokens they served.
    after = cluster.wait_replicas(
        lambda rs: len(rs) == 2 and all(emitted(rs)[r] > before[r] for r in before), timeout_s=30
    )
    print(f"\ntokens served by each replica: { {r: emitted(after)[r] - before[r] for r in before} }")


def test_a_failed_worker_behind_haproxy_loses_only_its_requests(cluster):
    survivor, failing = cluster.workers
    survivor_id = cluster.node_ids()[survivor.node_manager_port]
    with Load(cluster.endpoint, clients=4) as load:
        failure = cluster.fail_under_load(load, failing, survivor_id)
        load.wait_answered(20, after_s=failure.gone_s)
    in_flight, after = failure.in_flight(load.outcomes), failure.after(load.outcomes)
    print(
        f"\nworker failed (its processes killed in {failure.gone_s - failure.at_s:.3f} s): {len(in_flight)} requests "
        f"in flight, {sum(o.ok for o in in_flight)} answered, the others ended "
        f"{[round(o.end_s - failure.at_s, 2) for o in in_flight if not o.ok]} s after; "
        f"{len(after)} sent after, {sum(o.ok for o in after)} answered"
    )
    assert any(o.ok for o in in_flight), "the surviving replica's requests in flight were answered"
    # HAProxy retries a connection the lost node refuses on another replica (Ray's config: `retry-on` and
    # `option redispatch`), so no request sent after the failure fails, as none does through Serve's own proxy.
    assert all(o.ok for o in after), f"of {len(after)} sent after the failure: {failure.describe(after)}"
    # The lost replica's requests fail as a dead engine's do, HAProxy passing the ingress's answer through: 503 with
    # OpenAI's error object, not HAProxy's own error page.
    assert_dead_engine_errors(load.outcomes)

    _, _, replicas = cluster.replace_lost_replica(survivor_id)
    # HAProxy learns the new replica's port and sends it requests.
    before = emitted(replicas)
    with Load(cluster.endpoint, clients=4) as load:
        load.wait_answered(24)
    assert all(o.ok for o in load.outcomes)
    cluster.wait_replicas(lambda rs: len(rs) == 2 and all(emitted(rs)[r] > before[r] for r in before), timeout_s=30)
