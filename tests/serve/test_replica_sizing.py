"""Cluster tier: replicas sized to the machine. On CPU each engine rank takes one CPU of its placement bundle
and the replica actor none, so two replicas run on a 2-core machine; replicas that cannot fit the cluster at all
are refused at once, naming the shortfall, instead of waiting on Ray's scheduler."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from openai import OpenAI
from serve_process import ServeProcess, free_port


def serve_env(tmp_path) -> dict[str, str]:
    env = dict(os.environ, SPECSERVE_STATE_DIR=str(tmp_path / "state"))
    env.pop("RAY_ADDRESS", None)
    return env


# Two engines starting on two cores take two minutes; the multinode tier serves two replicas in every `make test`.
@pytest.mark.slow
def test_two_replicas_start_on_this_machine_and_both_serve(tmp_path, trained_pair):
    args = ["--replicas", "2", "--port", str(free_port()), "--metrics-port", str(free_port())]
    process = ServeProcess(args, serve_env(tmp_path), tmp_path / "serve.log")
    try:
        endpoint = process.start(timeout_s=900)
        client = OpenAI(base_url=endpoint, api_key="unused")
        for prompt in ("def add(a, b):", "import os\n", "class Tree:", "for i in range(10):"):
            answer = client.completions.create(model="specserve-tiny", prompt=prompt, max_tokens=8, temperature=0)
            assert answer.choices[0].text
        status = subprocess.run(
            [sys.executable, "-m", "specserve", "status", "--json"],
            env=process.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        replicas = json.loads(status.stdout)["replicas"]
        assert len(replicas) == 2 and len({r["replica_id"] for r in replicas}) == 2
    finally:
        if process.proc.poll() is None:
            process.stop(timeout_s=120)
        process.kill_tree()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            "server:\n  num_cpus: 1\ndeployment_config:\n  num_replicas: 2\n",
            "2 replica(s) x tensor_parallel_size 1 need 2 CPU (one per engine rank); the Ray cluster has 1",
        ),
        (
            "placement_group_config:\n  bundle_per_worker: {CPU: 1, pool_a: 1}\n",
            "placement_group_config.bundle_per_worker: 1 engine ranks x pool_a=1 need 1 pool_a; the Ray cluster has 0",
        ),
    ],
)
def test_replicas_that_cannot_fit_the_cluster_fail_at_once_naming_the_shortfall(
    tmp_path, trained_pair, config, message
):
    path = tmp_path / "serve.yaml"
    path.write_text(config)
    args = ["--config", str(path), "--port", str(free_port()), "--metrics-port", str(free_port())]
    done = subprocess.run(
        [sys.executable, "-m", "specserve", "serve", *args],
        env=serve_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr
