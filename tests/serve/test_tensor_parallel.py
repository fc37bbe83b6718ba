"""TP=2 wiring: `specserve serve --tp 2` on CPU (gloo, one core per rank). About 70x slower than
TP=1 here, so it runs in `make test-slow`, not in CI."""

from __future__ import annotations

import os

import pytest
from openai import OpenAI
from serve_process import ServeProcess, free_port

pytestmark = pytest.mark.slow


def test_tp2_replica_serves_and_reports(tmp_path, trained_pair):
    env = dict(os.environ, SPECSERVE_STATE_DIR=str(tmp_path / "state"))
    env.pop("RAY_ADDRESS", None)
    args = ["--tp", "2", "--port", str(free_port()), "--metrics-port", str(free_port()), "--policy", "fixed:k=2"]
    process = ServeProcess(args, env, tmp_path / "serve.log")
    try:
        endpoint = process.start(timeout_s=900)
        client = OpenAI(base_url=endpoint, api_key="unused", timeout=600)
        result = client.completions.create(model="specserve-tiny", prompt="def f():\n", max_tokens=8, temperature=0)
        assert result.usage.completion_tokens == 8
        workers = [p for p in process.descendants() if p.name().startswith("VLLM::Worker_TP")]
        assert len(workers) == 2, "one worker process per tensor-parallel rank"
        assert process.stop() == 0
    finally:
        process.kill_tree()
