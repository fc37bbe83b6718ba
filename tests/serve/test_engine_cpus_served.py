"""Serve tier: `specserve serve` with `cpu.engine_cpus`: the engine's threads on its core, every other process of the
local cluster (Ray's, Serve's proxy and replica, the driver) on the rest, and the endpoint serves as usual."""

from __future__ import annotations

import os

import psutil
import pytest
from openai import OpenAI
from serve_process import API_KEY, free_port, serving

from specserve.replicas.config.cpu_affinity import cores_of, is_engine_process

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to split")


def test_the_engine_computes_on_its_own_cores_and_the_cluster_on_the_others(tmp_path, trained_pair):
    allowed = os.sched_getaffinity(0)
    engine_core = max(allowed)
    config = tmp_path / "serve.yaml"
    config.write_text(f"cpu:\n  engine_cpus: '{engine_core}'\nspeculation:\n  policy: fixed:k=2\n")
    args = ["--port", str(free_port()), "--metrics-port", str(free_port()), "--config", str(config)]
    with serving(args, tmp_path, SPECSERVE_API_KEY=API_KEY) as server:
        client = OpenAI(base_url=server.endpoint, api_key=API_KEY)
        answer = client.completions.create(
            model="specserve-tiny", prompt="def add(a, b):", max_tokens=16, extra_body={"ignore_eos": True}
        )
        processes = [psutil.Process(server.proc.pid), *server.descendants()]
        engines = [p for p in processes if is_engine_process(p)]
        held = {p.pid: cores_of(p) for p in processes}
        omp_threads = engines[0].environ().get("OMP_NUM_THREADS") if engines else None
    assert answer.usage.completion_tokens == 16
    assert len(engines) == 1, "one replica, one EngineCore (the uniprocess executor)"
    assert held[engines[0].pid] == {engine_core}
    assert omp_threads == "1", "one OpenMP thread for its one core"
    serving_cores = allowed - {engine_core}
    off = {
        p.name(): held[p.pid]
        for p in processes
        if p not in engines and held[p.pid] and not held[p.pid] <= serving_cores
    }
    assert not off, f"processes on the engine's core: {off}"
    assert server.line_matching(rf"specserve: the engine on cores {engine_core}; Ray, Serve and Prometheus on ")
