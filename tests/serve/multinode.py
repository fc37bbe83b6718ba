"""A multi-node Ray cluster on this machine with `specserve serve` joined to it, for the cluster tests: a head,
worker nodes each holding one unit of a custom resource that stands in for a GPU, and an application whose
engine ranks ask one unit each (`placement_group_config.bundle_per_worker`), so that each replica lands on a worker
of its own."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import requests
from closed_loop import MODEL, Load, Outcome
from ray_nodes import RayNode, node_ids_by_port
from serve_process import ServeProcess, free_port

# Stands in for GPUs: one per worker node, one per engine rank.
ACCELERATOR = "specserve_test_accelerator"
# One proxy, the head's: every node's proxy would bind the same port on this one machine, and a client whose
# connection the failing node's proxy took would lose its request whichever replica served it.
PLACEMENT = (
    "deployment_config:\n  num_replicas: 2\n"
    f"placement_group_config:\n  bundle_per_worker: {{CPU: 1, {ACCELERATOR}: 1}}\n"
    "server:\n  proxy_location: HeadOnly\n"
)


@dataclass(frozen=True)
class Failure:
    """When a node failed, on a load's clock: the kill began at ``at_s`` and every process of the node was gone at
    ``gone_s``. Killing a node's process tree takes a moment, and a request sent within it can still reach the
    dying replica, so it counts as in flight, not as sent after."""

    at_s: float
    gone_s: float

    def in_flight(self, outcomes: list[Outcome]) -> list[Outcome]:
        return [o for o in outcomes if o.start_s < self.gone_s and o.end_s > self.at_s]

    def after(self, outcomes: list[Outcome]) -> list[Outcome]:
        return [o for o in outcomes if o.start_s > self.gone_s]

    def describe(self, outcomes: list[Outcome]) -> str:
        """Failed requests, each as (start relative to the kill, status, detail), for an assertion's message."""
        return str([(round(o.start_s - self.at_s, 3), o.status, o.detail[:200]) for o in outcomes if not o.ok])


@dataclass
class Cluster:
    head: RayNode
    tmp: Path
    workers: list[RayNode] = field(default_factory=list)
    server: ServeProcess | None = None
    endpoint: str = ""

    def add_worker(self) -> RayNode:
        """One more worker node with one accelerator; its log is worker-a.log, worker-b.log, ... in join order."""
        log = self.tmp / f"worker-{chr(ord('a') + len(self.workers))}.log"
        worker = RayNode.worker(self.head, log, num_cpus=1, resources={ACCELERATOR: 1})
        self.workers.append(worker)
        return worker

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

    def fail_under_load(self, load: Load, failing: RayNode, survivor_id: str) -> Failure:
        """Fail ``failing`` once ``load`` has 20 answers; returns when status lists only the survivor's replica."""
        load.wait_answered(20)
        at_s = load.now()
        failing.fail()
        failure = Failure(at_s, load.now())
        replicas = self.wait_replicas(lambda rs: len(rs) == 1, timeout_s=60)
        assert replicas[0]["node_id"] == survivor_id
        return failure

    def replace_lost_replica(self, survivor_id: str) -> tuple[RayNode, str, list[dict]]:
        """A new worker joins; Serve starts the lost replica on it. Returns the node, its id and the replicas."""
        joined = self.add_worker()
        joined_id = self.node_ids()[joined.node_manager_port]
        replicas = self.wait_replicas(lambda rs: len(rs) == 2, timeout_s=600)
        assert {r["node_id"] for r in replicas} == {survivor_id, joined_id}
        assert len(engines(joined)) == 1
        return joined, joined_id, replicas

    def complete(self, prompt: str) -> str:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0}
        response = requests.post(f"{self.endpoint}/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["text"]


def assert_dead_engine_errors(outcomes: list[Outcome]) -> None:
    """Requests that failed say so as a dead engine does: 503, OpenAI's error object, nothing of the traceback."""
    failed = [o for o in outcomes if not o.ok]
    assert all(o.status == 503 and '"engine_unavailable"' in o.detail for o in failed), [
        (o.status, o.detail[:300]) for o in failed
    ]


def engines(node: RayNode) -> list:
    return node.descendants_named("VLLM::EngineCore")


@contextlib.contextmanager
def joined_cluster(tmp: Path, env: dict[str, str], workers: int, config: str = PLACEMENT) -> Iterator[Cluster]:
    """A head and ``workers`` workers started with ``env``, and `specserve serve --config CONFIG` begun against
    them (the caller waits for its endpoint). On exit `serve` is stopped (a clean stop is asserted where the body
    got that far) and every node is shut down; a node that leaves processes behind fails the test."""
    cluster = Cluster(RayNode.head(env, tmp / "head.log", num_cpus=1), tmp)
    try:
        for _ in range(workers):
            cluster.add_worker()
        (tmp / "serve.yaml").write_text(config)
        cluster.server = ServeProcess(
            # `make serve` passes --prometheus-port whenever `prometheus` is installed; a joined cluster's own applies.
            ["--config", str(tmp / "serve.yaml"), "--port", str(free_port()), "--prometheus-port", str(free_port())],
            dict(env, RAY_ADDRESS=cluster.head.address),
            tmp / "serve.log",
        )
        cluster.server.begin()
        yield cluster
        assert cluster.server.stop() == 0
    finally:
        if cluster.server is not None:
            cluster.server.kill_tree()
        leftover = [name for node in [*cluster.workers, cluster.head] for name in node.shut_down()]
        assert not leftover, f"ray start left running: {leftover}"
