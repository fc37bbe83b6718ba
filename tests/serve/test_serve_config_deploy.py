"""deploy/serve/specserve.yaml deployed with `serve run` onto a local Ray cluster on CPU answers an OpenAI request,
`specserve status` sees its replica, and deploy/prometheus/prometheus.yml finds the cluster's metrics through Ray's
service-discovery file.

Only what names the cluster's hardware and model folders changes: the CPU instead of a GPU, the tiny pair for
the 7B one (and its shorter context), one replica (this machine has cores for one engine), a free loopback port.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import requests
import yaml
from openai import OpenAI
from serve_process import TrackedProcess, free_port, processes_under, signal_state

from specserve.cluster import alert_rules
from specserve.cluster.prometheus import PrometheusServer, alerting_rules

REPO = Path(__file__).resolve().parents[2]
SERVE_CONFIG = REPO / "deploy" / "serve" / "specserve.yaml"
PROMETHEUS_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"


@pytest.fixture
def cluster_tmp():
    # Ray's temporary folder for this cluster (TMPDIR): its discovery file lands there, and its processes name it.
    folder = Path(tempfile.mkdtemp(prefix="ss-deploy-", dir="/tmp"))
    try:
        yield folder
    finally:
        for process in processes_under(folder):
            process.kill()
        shutil.rmtree(folder, ignore_errors=True)


def local_serve_config(trained_pair, port: int) -> dict:
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    config["http_options"] = {"host": "127.0.0.1", "port": port}
    (app,) = config["applications"]
    args = app["args"]
    args["device"] = "cpu"
    args["model_loading_config"]["model_source"] = str(trained_pair.target)
    args["speculation"]["draft"] = str(trained_pair.draft)
    args["engine_kwargs"]["max_model_len"] = 512
    # The file autoscales over GPU workers; here Serve's autoscaler gets the file's config, held at one CPU engine.
    args["deployment_config"]["autoscaling_config"].update(min_replicas=1, initial_replicas=1, max_replicas=1)
    return config


def gcs_address(folder: Path) -> str:
    """The address of the cluster `serve run` started: ray.init records it nowhere, but Ray's own processes (the
    raylet, the dashboard) are started with it."""
    for process in processes_under(folder):
        for arg in process.cmdline():
            if arg.startswith("--gcs-address="):
                return arg.split("=", 1)[1]
    raise LookupError(f"no Ray process under {folder} names its GCS address")


def wait_for_models(endpoint: str, process: TrackedProcess, timeout_s: float = 600) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.proc.poll() is None, f"serve run exited:\n{process.tail()}"
        try:
            response = requests.get(f"{endpoint}/models", timeout=5)
            if response.status_code == 200 and (data := response.json().get("data")):
                return [model["id"] for model in data]
        except requests.RequestException:
            pass
        time.sleep(2)
    raise TimeoutError(f"{endpoint} did not list a model in {timeout_s} s:\n{process.tail()}")


def test_serve_run_deploys_it_and_status_and_prometheus_see_it(tmp_path, trained_pair, cluster_tmp) -> None:
    port = free_port()
    config = local_serve_config(trained_pair, port)
    config_file = tmp_path / "specserve.yaml"
    config_file.write_text(yaml.safe_dump(config))
    # Token auth would need the cluster's token in every client; this test is about the
    # deployment, so the cluster and `specserve status` run without it.
    # PYTHONFAULTHANDLER: should `serve run` hang on its Ctrl-C, a SIGABRT shows where (see the end).
    env = dict(os.environ, TMPDIR=str(cluster_tmp), PYTHONPATH=str(REPO), RAY_AUTH_MODE="disabled")
    env["PYTHONFAULTHANDLER"] = "1"
    env.pop("RAY_ADDRESS", None)
    serve = TrackedProcess(env, tmp_path / "serve.log")
    serve.launch([str(Path(sys.executable).parent / "serve"), "run", str(config_file)])
    prometheus = PrometheusServer(
        tmp_path / "prometheus",
        free_port(),
        config=PROMETHEUS_CONFIG.read_text().replace("/tmp/ray/", f"{cluster_tmp}/ray/"),
    )
    try:
        endpoint = f"http://127.0.0.1:{port}/v1"
        model_id = config["applications"][0]["args"]["model_loading_config"]["model_id"]
        assert wait_for_models(endpoint, serve) == [model_id]
        client = OpenAI(base_url=endpoint, api_key="unused")
        result = client.completions.create(model=model_id, prompt="def main():\n", max_tokens=16, temperature=0)
        assert result.choices[0].text and result.usage.completion_tokens > 0

        # The builder started specserve's controller, so the command line sees the replica on this cluster.
        address = gcs_address(cluster_tmp)
        status = subprocess.run(
            [sys.executable, "-m", "specserve", "status", "--json"],
            env=dict(env, RAY_ADDRESS=address),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert status.returncode == 0, status.stderr
        assert [r["model_id"] for r in json.loads(status.stdout)["replicas"]] == [model_id]

        if PrometheusServer.binary() is None:
            pytest.skip("Debian's prometheus is not installed")
        # The deployed config names its rules file beside it, as compose.yaml mounts it.
        prometheus.workdir.mkdir(parents=True, exist_ok=True)
        shutil.copy(alert_rules.RULES_FILE, prometheus.workdir)
        prometheus.start()
        (sample,) = prometheus.wait_for(f'ray_specserve_speculation_max_k{{model="{model_id}"}}', timeout_s=120)
        assert sample["value"][1] == str(config["applications"][0]["args"]["speculation"]["max_k"])
        assert [r["name"] for r in alerting_rules(prometheus.url)] == [a.name for a in alert_rules.alerts()]
    finally:
        prometheus.stop()
        hung = ""
        if serve.proc.poll() is None:
            serve.proc.send_signal(signal.SIGINT)  # serve run's Ctrl-C: shuts Serve and its local cluster down
            try:
                serve.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                hung = signal_state(serve.proc.pid)
                tree = serve.descendants()  # before the abort: the dead leader's children are orphans after it
                serve.proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack, then it dies
                time.sleep(5)
                serve.kill_tree()
                for process in tree:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        process.kill()
                serve.proc.wait(timeout=60)
    deadline = time.monotonic() + 60
    while processes_under(cluster_tmp) and time.monotonic() < deadline:
        time.sleep(1)
    assert not processes_under(cluster_tmp), "serve run stops the cluster it started"
    if hung:
        # Seen in fresh-clone runs of the whole suite on this 2-core machine (never alone): Ray's `serve run` still in
        # its sleep loop 120 s after its Ctrl-C, no KeyboardInterrupt raised. The child now starts with SIGINT
        # unblocked and not ignored; should it hang still, its signal masks and stacks say why. Reported as an
        # expected failure, with the log, not hidden.
        pytest.xfail(
            f"serve run did not exit within 120 s of SIGINT ({hung}; killed, its stacks last):\n{serve.tail(80)}"
        )
