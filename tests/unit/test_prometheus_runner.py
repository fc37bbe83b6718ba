"""specserve/cluster/prometheus.py: the Prometheus runner `specserve serve --prometheus-port` and the observability
tests share, run for real (Debian's `prometheus`) against a prometheus_client exporter standing in for Ray's
metrics port; and `--prometheus-port`'s fail-fast errors."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.error
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from specserve.cluster.prometheus import PrometheusError, PrometheusServer


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specserve", "serve", *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_its_config_scrapes_the_targets_at_the_interval(tmp_path):
    config = yaml.safe_load(PrometheusServer(tmp_path, 9090, ["127.0.0.1:8080"], scrape_interval_s=5).config_text())
    assert config["global"]["scrape_interval"] == "5s"
    (job,) = config["scrape_configs"]
    assert job["static_configs"] == [{"targets": ["127.0.0.1:8080"]}]


@pytest.fixture
def exporter():
    registry = CollectorRegistry()
    Gauge("specserve_runner_probe", "A gauge for the runner's test.", registry=registry).set(7)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield f"127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_it_scrapes_answers_promql_and_stops(tmp_path, exporter):
    if PrometheusServer.binary() is None:
        pytest.skip("Debian's prometheus is not installed (scripts/install.sh installs it when run as root)")
    prometheus = PrometheusServer(tmp_path / "prometheus", free_port(), [exporter])
    prometheus.start()
    try:
        prometheus.wait_ready()
        (sample,) = prometheus.wait_for("specserve_runner_probe", timeout_s=30)
        assert sample["metric"]["instance"] == exporter and sample["value"][1] == "7"
        with pytest.raises(urllib.error.HTTPError) as bad:
            prometheus.wait_for("sum(", timeout_s=30)  # a bad query fails at once instead of waiting out the timeout
        assert bad.value.code == 400
        assert (tmp_path / "prometheus" / "data").is_dir(), "its TSDB lives in its folder"
    finally:
        prometheus.stop()
    assert prometheus.proc is not None and prometheus.proc.returncode is not None


def test_it_evaluates_the_rules_it_is_given(tmp_path, exporter):
    if PrometheusServer.binary() is None:
        pytest.skip("Debian's prometheus is not installed")
    alert = {"alert": "ProbeHigh", "expr": "specserve_runner_probe > 5", "labels": {"severity": "warning"}}
    quiet = {"alert": "ProbeLow", "expr": "specserve_runner_probe < 5"}
    rules = {"groups": [{"name": "probe", "rules": [alert, quiet]}]}
    prometheus = PrometheusServer(tmp_path / "prometheus", free_port(), [exporter], rules=rules)
    prometheus.start()
    try:
        prometheus.wait_ready()
        (firing,) = prometheus.wait_for('ALERTS{alertstate="firing"}', timeout_s=30)
        assert firing["metric"]["alertname"] == "ProbeHigh" and firing["metric"]["severity"] == "warning"
    finally:
        prometheus.stop()
    with pytest.raises(ValueError, match="names its own rule files"):
        PrometheusServer(tmp_path, 9090, config="global: {}\n", rules=rules)


def test_a_prometheus_that_cannot_start_is_an_error_with_its_log(tmp_path, exporter):
    if PrometheusServer.binary() is None:
        pytest.skip("Debian's prometheus is not installed")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        prometheus = PrometheusServer(tmp_path, busy.getsockname()[1], [exporter])
        prometheus.start()
        try:
            with pytest.raises(PrometheusError, match="prometheus exited") as error:
                prometheus.wait_ready(timeout_s=30)
        finally:
            prometheus.stop()
    assert "address already in use" in str(error.value)


def test_busy_prometheus_port_is_a_cli_error_naming_the_flag():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = serve("--port", str(free_port()), "--prometheus-port", str(port))
    assert done.returncode == 2
    assert f"--prometheus-port {port}: cannot bind 127.0.0.1:{port}" in done.stderr


def test_missing_prometheus_binary_is_a_cli_error_naming_the_flag_and_the_package():
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    env["PATH"] = str(Path(sys.executable).parent)  # the virtualenv's tools, no prometheus
    port = free_port()
    done = serve("--port", str(free_port()), "--prometheus-port", str(port), env=env)
    assert done.returncode == 2
    assert f"--prometheus-port {port}: no `prometheus` binary on PATH" in done.stderr
    assert "apt-get install prometheus" in done.stderr
