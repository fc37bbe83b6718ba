"""Serve tier: `specserve serve` in Ray Serve's throughput-optimized mode (`server.throughput_optimized: true`, gRPC
between the ingress and the replica, the ingress replica serving HTTP itself): the same answers, errors, key and
control plane as in the default mode, and a clean stop. It also runs the other throughput knob, vLLM's stream
interval (`engine_kwargs.stream_interval: 8`): streamed text arrives in chunks of 8 tokens or more, and is the same
text; and Ray Serve's HAProxy ingress (`server.haproxy: true`) takes HTTP in place of its Python proxy, and stops with
the rest."""

from __future__ import annotations

import contextlib

import psutil
import requests
from openai import OpenAI
from serve_process import API_KEY, free_port, serving, specserve_cli, wait_for_replica

MODEL = "specserve-tiny"
PROMPT = "def fibonacci(n):\n"


def names(processes: list[psutil.Process]) -> set[str]:
    alive = set()
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            alive.add(process.name())
    return alive


def test_the_throughput_optimized_mode_serves_the_same_endpoint(tmp_path, trained_pair):
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server:\n  throughput_optimized: true\n  haproxy: true\n"
        "engine_kwargs:\n  stream_interval: 8\n"
        "speculation:\n  policy: fixed:k=3\n"
    )
    args = ["--port", str(free_port()), "--metrics-port", str(free_port()), "--config", str(config)]
    with serving(args, tmp_path, SPECSERVE_API_KEY=API_KEY) as server:
        # Serve's controller says which mode it runs in.
        server.wait_for_line(r".*Throughput optimized Ray Serve enabled", timeout_s=60)
        assert "haproxy" in names(server.descendants()), "HAProxy serves HTTP"
        client = OpenAI(base_url=server.endpoint, api_key=API_KEY)
        whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0)
        stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stream=True)
        texts = [chunk.choices[0].text for chunk in stream if chunk.choices and chunk.choices[0].text]
        assert "".join(texts) == whole.choices[0].text
        assert whole.usage.completion_tokens == 24
        # The first token alone, then one chunk per 8 tokens or more: at most 1 + ceil(23 / 8). Chunked per step
        # instead, k = 3's steps of at most 4 tokens would need 1 + ceil(23 / 4) = 7 or more.
        assert len(texts) <= 4, texts

        assert specserve_cli(server.env, "policy", "set", "fixed:k=0").returncode == 0
        # Through the mode's handles to the replica, and back in its telemetry.
        wait_for_replica(server, until=lambda r: r["engine"]["policy"] == "fixed:k=0", timeout_s=30)
        plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0)
        assert plain.choices[0].text == whole.choices[0].text, "greedy output with speculation off is the same"

        bad = requests.post(
            f"{server.endpoint}/completions",
            json={"model": MODEL, "prompt": "x", "max_tokens": -5},
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=60,
        )
        assert 400 <= bad.status_code < 500 and bad.json()["error"]["message"], bad.text
        keyless = requests.post(f"{server.endpoint}/completions", json={"model": MODEL, "prompt": "x"}, timeout=60)
        assert keyless.status_code == 401, keyless.text

        tree = server.descendants()
        assert server.stop() == 0
        alive = server.wait_gone(tree, timeout_s=60)
        assert not alive, f"left running: {[(p.pid, p.name()) for p in alive]}"
