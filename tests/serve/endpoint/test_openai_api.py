"""Serve tier: the package's `specserve serve`, used over real HTTP with the official openai client, and its
control plane (status, policy set, metrics, Prometheus)."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
import requests
from serve_process import API_KEY, specserve_cli, wait_for_replica

from specserve import metrics_catalog as catalog
from specserve.cluster import alert_rules, prometheus

MODEL = "specserve-tiny"
NO_PROMETHEUS = "Debian's prometheus is not installed (scripts/install.sh installs it when run as root)"


def cli(server, *args: str) -> subprocess.CompletedProcess:
    return specserve_cli(server.env, *args)


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_completion(client):
    result = client.completions.create(model=MODEL, prompt="def main():\n", max_tokens=24, temperature=0)
    assert result.object == "text_completion"
    assert result.usage.completion_tokens == 24 or result.choices[0].finish_reason == "stop"
    assert result.choices[0].text


def test_completion_streamed(client):
    chunks = list(
        client.completions.create(model=MODEL, prompt="import os\n", max_tokens=24, temperature=0, stream=True)
    )
    assert len(chunks) >= 2
    assert "".join(c.choices[0].text for c in chunks if c.choices)


def test_chat_completion(client):
    result = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "print hello"}], max_tokens=16, temperature=0
    )
    assert result.object == "chat.completion"
    assert result.choices[0].message.role == "assistant"
    assert result.choices[0].message.content


def test_chat_completion_streamed(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "sort a list"}],
            max_tokens=16,
            temperature=0,
            stream=True,
        )
    )
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_same_greedy_output_as_without_speculation(server, client):
    prompt = "class Config:\n    def __init__(self"
    speculative = client.completions.create(model=MODEL, prompt=prompt, max_tokens=32, temperature=0)
    assert cli(server, "policy", "set", "fixed:k=0").returncode == 0
    # The directive rides on the replica's next telemetry round; the round after reports it.
    before = wait_for_replica(server, until=lambda r: r["engine"]["policy"] == "fixed:k=0")["engine"]
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=32, temperature=0)
    emitted = before["num_emitted_tokens"] + plain.usage.completion_tokens
    after = wait_for_replica(server, until=lambda r: r["engine"]["num_emitted_tokens"] >= emitted)["engine"]
    assert cli(server, "policy", "set", "adaptive").returncode == 0
    assert plain.choices[0].text == speculative.choices[0].text
    steps = [a - b for a, b in zip(after["num_steps_by_k"], before["num_steps_by_k"], strict=True)]
    assert after["k"] == 0 and steps[0] > 0 and sum(steps[1:]) == 0, f"steps by k during the request: {steps}"


BAD_REQUESTS = {
    "malformed JSON": ("/completions", '{"model": "specserve-tiny", "prompt": '),
    "unknown model": ("/completions", {"model": "nope", "prompt": "x", "max_tokens": 4}),
    "negative max_tokens": ("/completions", {"model": MODEL, "prompt": "x", "max_tokens": -5}),
    "prompt longer than the context": ("/completions", {"model": MODEL, "prompt": "x = 1\n" * 2000, "max_tokens": 4}),
    "wrong type": ("/completions", {"model": MODEL, "prompt": "x", "max_tokens": "many"}),
    "wrong type in chat": ("/chat/completions", {"model": MODEL, "messages": "hello"}),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_input_gets_a_4xx_with_a_message_and_the_replica_keeps_serving(server, client, case):
    path, body = BAD_REQUESTS[case]
    data = body if isinstance(body, str) else json.dumps(body)
    response = requests.post(
        server.endpoint + path,
        data=data,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"},
        timeout=60,
    )
    assert 400 <= response.status_code < 500, response.text
    # OpenAI's error object, also for the errors FastAPI itself raises (an unknown model, a malformed body).
    assert response.json()["error"]["message"], response.text
    assert client.completions.create(model=MODEL, prompt="x", max_tokens=4).choices[0].text is not None


def test_status_shows_the_replica_with_k_and_acceptance(server, client):
    client.completions.create(model=MODEL, prompt="for i in range(10):\n", max_tokens=32, temperature=0)
    time.sleep(1.5)
    replica = wait_for_replica(server)
    engine = replica["engine"]
    assert replica["model_id"] == MODEL
    assert 0 <= engine["k"] <= engine["max_k"] == 4
    assert 0.0 <= replica["acceptance"] <= 1.0
    assert sum(engine["num_drafted_per_pos"]) > 0
    table = cli(server, "status")
    assert table.returncode == 0
    # The table is the command's result: on stdout, where `specserve status | grep` finds it.
    header, *rows = table.stdout.splitlines()
    assert header.split()[:6] == ["REPLICA", "NODE", "METHOD", "POLICY", "K", "ACCEPT"]
    assert [row.split()[0] for row in rows] == [replica["replica_id"]]
    assert replica["replica_id"] not in table.stderr and "ACCEPT" not in table.stderr


def test_the_controller_grants_the_replicas_draft_transfers(server, client):
    client.completions.create(model=MODEL, prompt="import os\n", max_tokens=8, temperature=0)
    replica = wait_for_replica(server, until=lambda r: r["engine"]["memory_coordinated"])
    engine = replica["engine"]
    assert engine["draft_state"] == "resident" and engine["draft_bytes"] > 0
    assert engine["memory_reason"] == "draft resident"
    assert engine["num_kv_blocks_baseline"] == engine["num_kv_blocks_total"]


def test_policy_set_reaches_the_replica(server):
    replica = wait_for_replica(server)["replica_id"]
    done = cli(server, "policy", "set", "fixed:k=2", "--replica", replica)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"policy fixed:k=2 queued for 1 replica(s): {replica}\n"
    wait_for_replica(server, until=lambda r: r["engine"]["policy"] == "fixed:k=2", timeout_s=15)
    assert cli(server, "policy", "set", "adaptive").returncode == 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["policy", "set", "nope"], "unknown policy 'nope'"),
        (["policy", "set", "fixed:k=two"], "k='two'"),
        (["policy", "set", "fixed:k=1", "--replica", "ghost"], "unknown replica 'ghost'"),
    ],
)
def test_policy_set_errors_name_the_bad_value(server, args, message):
    done = cli(server, *args)
    assert done.returncode == 2
    assert message in done.stderr


def test_metrics_url_serves_specserve_and_vllm_metrics(server, client):
    metrics_url = server.line_matching(r"metrics: ").split()[1]
    client.completions.create(model=MODEL, prompt="while True:\n", max_tokens=32)
    deadline = time.monotonic() + 60  # Ray exports on a ~10 s cycle
    wanted = [
        "ray_specserve_speculation_k",
        "ray_specserve_draft_tokens_total",
        "ray_specserve_steps_total",
        "ray_specserve_kv_blocks_total",
        "ray_specserve_kv_blocks_baseline",
        "ray_specserve_draft_state",
        "ray_vllm_spec_decode_num_drafts_total",
    ]
    while True:
        text = requests.get(metrics_url, timeout=10).text
        missing = [name for name in wanted if name not in text]
        if not missing:
            break
        assert time.monotonic() < deadline, f"missing from {metrics_url}: {missing}"
        time.sleep(2)


def prometheus_url(server) -> str:
    """The URL of the Prometheus `specserve serve --prometheus-port` started, printed right after `metrics:`."""
    if prometheus.PrometheusServer.binary() is None:
        pytest.skip(NO_PROMETHEUS)
    lines = [line.split(":", 1)[0] for line in server.lines if line.startswith(("metrics: ", "prometheus: "))]
    assert lines == ["metrics", "prometheus"], server.tail()
    return server.line_matching(r"prometheus: ").split()[1]


def test_serves_prometheus_scraping_speculation_metrics(server, client):
    url = prometheus_url(server)
    metrics_host = server.line_matching(r"metrics: ").split()[1].split("/")[2]
    client.completions.create(model=MODEL, prompt="with open(path) as f:\n", max_tokens=32, temperature=0)
    # Ray exports every ~10 s and serve's Prometheus scrapes every 5 s.
    (steps, *_) = prometheus.wait_for(url, catalog.STEPS.exported, timeout_s=90)
    assert steps["metric"]["instance"] == metrics_host, "it scrapes the local cluster's metrics port"
    k = prometheus.wait_for(url, catalog.SPECULATION_K.exported)
    assert 0 <= float(k[0]["value"][1]) <= 4
    drafted = prometheus.wait_for(url, f'sum({catalog.DRAFT_TOKENS.exported}{{{catalog.POSITION}="0"}})')
    assert float(drafted[0]["value"][1]) > 0
    assert prometheus.wait_for(url, "ray_vllm_spec_decode_num_drafts_total")
    assert [t["health"] for t in targets(url)] == ["up"]


def test_its_prometheus_evaluates_specserve_alert_rules(server):
    url = prometheus_url(server)
    rules = prometheus.alerting_rules(url)
    assert [r["name"] for r in rules] == [a.name for a in alert_rules.alerts()]
    deadline = time.monotonic() + 30  # evaluated every scrape interval: wait for one round
    while any(r["health"] == "unknown" for r in rules) and time.monotonic() < deadline:
        time.sleep(1)
        rules = prometheus.alerting_rules(url)
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]


def targets(url: str) -> list[dict]:
    return requests.get(f"{url}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]


def test_a_one_rank_cpu_engine_runs_its_worker_inside_the_engine_core(server):
    # Ray Serve LLM would start a worker process that the EngineCore spins on (replicas/serve/engine.py).
    names = [p.name() for p in server.descendants()]
    assert any(name.startswith("VLLM::EngineCor") for name in names), names
    assert not any(name.startswith("VLLM::Worker") for name in names), names


def test_cpu_threads_reach_the_engine_past_the_one_ray_gives_a_cpu_less_replica(server):
    # Serve's replicas reserve no CPU, for which Ray sets OMP_NUM_THREADS=1; the EngineCore inherits the
    # replica's environment, so without `cpu.threads` the model runs on one core of this machine.
    (engine,) = [p for p in server.descendants() if p.name().startswith("VLLM::EngineCor")]
    assert engine.environ().get("OMP_NUM_THREADS") == str(os.cpu_count())
