"""The package's one server: default policy `adaptive`, max_k 4, draft offload on, one engine thread per core, an API
key required on every route, and Serve's own Prometheus where Debian's is installed. Modules run in name order:
`test_robustness_and_key.py` fuzzes the endpoint after the others used it, and `test_shutdown.py`, last, stops it;
the teardown only removes what a failed test left."""

from __future__ import annotations

import os

import pytest
from openai import OpenAI
from serve_process import API_KEY, free_port, serving

from specserve.cluster import prometheus


@pytest.fixture(scope="package")
def server(tmp_path_factory, trained_pair):
    folder = tmp_path_factory.mktemp("endpoint")
    config = folder / "serve.yaml"
    # draft_offload: the triggers never fire on this idle pool; the grants flow. cpu.threads: one per core.
    config.write_text(f"speculation:\n  draft_offload: true\ncpu:\n  threads: {os.cpu_count()}\n")
    args = ["--port", str(free_port()), "--metrics-port", str(free_port()), "--max-k", "4", "--config", str(config)]
    if prometheus.PrometheusServer.binary() is not None:
        args += ["--prometheus-port", str(free_port())]  # as `make serve` runs it
    with serving(args, folder, SPECSERVE_API_KEY=API_KEY) as process:
        yield process


@pytest.fixture(scope="package")
def client(server) -> OpenAI:
    return OpenAI(base_url=server.endpoint, api_key=API_KEY)
