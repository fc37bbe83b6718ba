"""Cluster tier: specserve on a multi-node Ray cluster on this machine. A head and two worker nodes started with
`ray start`, each worker holding one unit of a custom resource that stands in for a GPU; `specserve serve`
joins with RAY_ADDRESS while only one worker is up and asks one unit per engine rank (`resources_per_rank`), so
its two replicas land on different workers once the second joins. Then a worker fails under load, and a new one
joins. Last, `specserve serve` stops and removes only its application: the cluster and its controller keep
running for the next deployment. One cluster for the module, about four minutes: the tests run in order."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest
import requests
from closed_loop import MODEL, Load
from ray_nodes import RayNode, node_ids_by_port, ray_env
from serve_process import ServeProcess, free_port

# Stands in for GPUs: one per worker node, one per engine rank.
ACCELERATOR = "specserve_test_accelerator"


@dataclass
class Cluster:
    head: RayNode
    workers: list[RayNode]
    server: ServeProcess
    endpoint: str
    tmp: object

    def status(self) -> list[dict]:
        done = self.cli("status", "--json")
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)["replicas"]

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "specserve", *args], env=self.server.env, capture_output=True, text=True, timeout=120
        )

    def node_ids(self) -> dict[int, str]:
        return node_ids_by_port(self.head.address, self.head.env)

    def wait_replicas(self, until, timeout_s: float) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if until(replicas := self.status()):
                return replicas
            time.sleep(1.0)
        raise TimeoutError(f"replicas not as expected within {timeout_s} s: {replicas}\n{self.server.tail()}")

    def complete(self, prompt: str) -> str:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0}
        response = requests.post(f"{self.endpoint}/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["text"]


def engines(node: RayNode) -> list:
    return [p for p in node.descendants() if p.name() == "VLLM::EngineCore"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, trained_pair):
    tmp = tmp_path_factory.mktemp("multinode")
    env = ray_env(tmp)
    head = RayNode.head(env, tmp / "head.log", num_cpus=1)
    workers: list[RayNode] = []
    server = None
    try:
        workers.append(RayNode.worker(head, tmp / "worker-a.log", num_cpus=1, resources={ACCELERATOR: 1}))
        config = tmp / "serve.yaml"
        # One proxy, the head's: every node's proxy would bind the same port on this one machine, and a client
        # whose connection the failing node's proxy took would lose its request whichever replica served it.
        config.write_text(f"replicas: 2\nresources_per_rank: {{{ACCELERATOR}: 1}}\nproxy_location: HeadOnly\n")
        server = ServeProcess(
            # `make serve` passes --prometheus-port whenever `prometheus` is installed; a joined cluster's own applies.
            ["--config", str(config), "--port", str(free_port()), "--prometheus-port", str(free_port())],
            dict(env, RAY_ADDRESS=head.address),
            tmp / "serve.log",
        )
        server.begin()
        # A joined cluster may still grow, so a shortfall is said, not refused; the second worker then joins.
        server.wait_for_line(
            rf"specserve: waiting for the cluster to grow: resources_per_rank: 2 engine ranks x {ACCELERATOR}=1 "
            rf"need 2 {ACCELERATOR}; the Ray cluster has 1",
            timeout_s=120,
        )
        workers.append(RayNode.worker(head, tmp / "worker-b.log", num_cpus=1, resources={ACCELERATOR: 1}))
        endpoint = server.wait_endpoint(timeout_s=900)
        yield Cluster(head, workers, server, endpoint, tmp)
        assert server.stop() == 0
    finally:
        if server is not None:
            server.kill_tree()
        leftover = [name for node in [*workers, head] for name in node.shut_down()]
        assert not leftover, f"ray start left running: {leftover}"


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
        load.wait_answered(20)
        failed_at = load.now()
        failing.fail()
        # The controller forgets a replica that stops reporting; the other one stays in its view throughout.
        replicas = cluster.wait_replicas(lambda rs: len(rs) == 1, timeout_s=60)
        assert replicas[0]["node_id"] == survivor_id
        answered = len(load.outcomes)
        load.wait_answered(20, after_s=failed_at)
    in_flight = [o.ok for o in load.outcomes if o.start_s < failed_at < o.end_s]
    after = [o.ok for o in load.outcomes if o.start_s > failed_at]
    assert len(load.outcomes) > answered
    # Only requests the failed node was serving may fail: the other replica's were answered, and every request
    # sent after the failure was too.
    assert any(in_flight), f"no request in flight at the failure was answered: {in_flight}"
    assert all(after), f"{after.count(False)} of {len(after)} requests sent after the failure failed"
    # Those that failed say so as a dead engine does: 503, OpenAI's error object, nothing of the traceback.
    failed = [o for o in load.outcomes if not o.ok]
    assert all(o.status == 503 and '"engine_unavailable"' in o.detail for o in failed), [
        (o.status, o.detail[:300]) for o in failed
    ]

    # Serve replaces the lost replica once a node with a free accelerator joins.
    joined = RayNode.worker(cluster.head, cluster.tmp / "worker-c.log", num_cpus=1, resources={ACCELERATOR: 1})
    cluster.workers.append(joined)
    joined_id = cluster.node_ids()[joined.node_manager_port]
    replicas = cluster.wait_replicas(lambda rs: len(rs) == 2, timeout_s=600)
    assert {r["node_id"] for r in replicas} == {survivor_id, joined_id}

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
    assert len(engines(joined)) == 1
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
