"""Cluster tier: with RAY_ADDRESS set, `specserve serve` deploys onto an existing Ray cluster (a real
`ray start --head` here) instead of starting one, and on SIGTERM removes only its application."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import requests
from openai import OpenAI
from ray_nodes import RayNode, ray_env
from serve_process import ServeProcess, free_port


@pytest.fixture
def head(tmp_path):
    node = RayNode.head(ray_env(tmp_path), tmp_path / "head.log", num_cpus=3)
    try:
        yield node
    finally:
        leftover = node.shut_down()
        assert not leftover, f"ray start left running: {leftover}"


def test_serve_deploys_onto_an_existing_cluster_and_leaves_it_running(head, tmp_path, trained_pair):
    env = dict(head.env, RAY_ADDRESS=head.address)
    # `make serve` passes --prometheus-port whenever `prometheus` is installed; a joined cluster's own applies.
    server = ServeProcess(["--port", str(free_port()), "--prometheus-port", str(free_port())], env, tmp_path / "s.log")
    try:
        endpoint = server.start()
        assert server.line_matching(r"metrics: ") is None, "the cluster's own metrics port applies"
        assert server.line_matching(r"specserve: --prometheus-port \d+ ignored: joining the cluster at RAY_ADDRESS")
        assert server.line_matching(r"prometheus: ") is None
        assert not [p for p in server.descendants() if p.name() == "prometheus"]
        client = OpenAI(base_url=endpoint, api_key="unused")
        assert client.completions.create(model="specserve-tiny", prompt="x = ", max_tokens=8).choices[0].text
        engines = [p for p in head.descendants() if p.name() == "VLLM::EngineCore"]
        assert len(engines) == 1, "the engine runs on the existing cluster, not under `specserve serve`"
        assert server.stop() == 0
    finally:
        server.kill_tree()
    assert not server.wait_gone(engines, timeout_s=60), "the application's engine is gone"
    assert requests.get(f"{endpoint}/models", timeout=10).status_code == 404
    # The cluster and its specserve controller keep running for the next deployment.
    names = [p.name() for p in head.descendants()]
    assert "raylet" in names and any(name.startswith("ray::ClusterCon") for name in names)
    status = subprocess.run(
        [sys.executable, "-m", "specserve", "status", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout) == {"replicas": []}, "a stopped replica unregisters itself"
