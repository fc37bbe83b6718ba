"""Cluster tier: specserve on a multi-node Ray cluster on this machine. A head and two worker nodes started with
`ray start`, each worker holding one unit of a custom resource that stands in for a GPU; `specserve serve`
joins with RAY_ADDRESS while only one worker is up and asks one unit per engine rank
(`placement_group_config.bundle_per_worker`), so its two replicas land on different workers once the second joins.
Then a worker fails under load, and a new one joins. Last, `specserve serve` stops and removes only its application:
the cluster and its controller keep running for the next deployment. One cluster for the module
(`multinode.joined_cluster`), about four minutes: the tests run in order."""

from __future__ import annotations

import pytest
import requests
from closed_loop import Load
from multinode import ACCELERATOR, assert_dead_engine_errors, engines, joined_cluster
from ray_nodes import ray_env
from serve_process import ServeProcess


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, trained_pair):
    tmp = tmp_path_factory.mktemp("multinode")
    with joined_cluster(tmp, ray_env(tmp), workers=1) as cluster:
        # A joined cluster may still grow, so a shortfall is said, not refused; the second worker then joins.
        cluster.server.wait_for_line(
            rf"specserve: waiting for the cluster to grow: placement_group_config.bundle_per_worker: 2 engine ranks "
            rf"x {ACCELERATOR}=1 need 2 {ACCELERATOR}; the Ray cluster has 1",
            timeout_s=120,
        )
        cluster.add_worker()
        cluster.endpoint = cluster.server.wait_endpoint(timeout_s=900)
        yield cluster


def test_the_replicas_run_on_different_worker_nodes_and_status_names_each_node(cluster):
    replicas = cluster.status()
    ids = cluster.node_ids()
    worker_ids = {ids[w.node_manager_port] for w in cluster.workers}
    assert {r["node_id"] for r in replicas} == worker_ids, "one replica per worker, none on the head"
    assert [len(engines(w)) for w in cluster.workers] == [1, 1] and not engines(cluster.head)
    table = cluster.cli("status").stdout
    for replica in replicas:
        row = next(line for line in table.splitlines() if line.startswith(replica["replica_id"]))
        assert row.split()[1] == replica["node_id"][:12], table
    assert all(cluster.complete(prompt) for prompt in ("def add(a, b):", "import os\n", "class Tree:"))


def test_a_joined_cluster_keeps_its_own_metrics_and_prometheus(cluster):
    server = cluster.server
    assert server.line_matching(r"metrics: ") is None, "the cluster's own metrics port applies"
    assert server.line_matching(r"specserve: --prometheus-port \d+ ignored: joining the cluster at RAY_ADDRESS")
    assert server.line_matching(r"prometheus: ") is None
    assert not [p for p in server.descendants() if p.name() == "prometheus"]


def test_a_failed_worker_takes_only_its_replica_and_serve_brings_it_up_on_a_new_node(cluster):
    survivor, failing = cluster.workers
    ids = cluster.node_ids()
    survivor_id = ids[survivor.node_manager_port]
    with Load(cluster.endpoint, clients=4) as load:
        # The controller forgets a replica that stops reporting; the other one stays in its view throughout.
        failure = cluster.fail_under_load(load, failing, survivor_id)
        answered = len(load.outcomes)
        load.wait_answered(20, after_s=failure.gone_s)
    in_flight = [o.ok for o in failure.in_flight(load.outcomes)]
    after = failure.after(load.outcomes)
    assert len(load.outcomes) > answered
    # Only requests the failed node was serving may fail: the other replica's were answered, and every request
    # sent after the failure was too.
    assert any(in_flight), f"no request in flight at the failure was answered: {in_flight}"
    assert all(o.ok for o in after), f"of {len(after)} sent after the failure: {failure.describe(after)}"
    assert_dead_engine_errors(load.outcomes)

    # Serve replaces the lost replica once a node with a free accelerator joins.
    _, joined_id, _ = cluster.replace_lost_replica(survivor_id)

    # Before its first request, the new replica's acceptance estimate rests on the survivor's evidence (the
    # controller's prior for a new replica of the deployment), not on a cold prior.
    def seeded(replicas: list[dict]) -> bool:
        engine = next((r["engine"] for r in replicas if r["node_id"] == joined_id), None)
        return (
            engine is not None
            and any(engine["acceptance_ema_reached_per_pos"])
            and not any(engine["num_reached_per_pos"])
        )

    cluster.wait_replicas(seeded, timeout_s=30)
    assert cluster.complete("for i in range(10):")


def test_stopping_serve_removes_only_its_application_and_leaves_the_cluster_running(cluster):
    running = [engine for node in cluster.workers for engine in engines(node)]
    assert running
    assert cluster.server.stop() == 0
    assert not ServeProcess.wait_gone(running, timeout_s=60), "the application's engines are gone"
    assert requests.get(f"{cluster.endpoint}/models", timeout=10).status_code == 404
    names = [p.name() for p in cluster.head.descendants()]
    assert "raylet" in names and any(name.startswith("ray::ClusterCon") for name in names)
    assert all(worker.proc.poll() is None for worker in cluster.workers[:1] + cluster.workers[2:])
    assert cluster.status() == [], "a stopped replica unregisters itself"
