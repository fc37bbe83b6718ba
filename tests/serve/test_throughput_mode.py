"""Serve tier: `specserve serve` in Ray Serve's throughput-optimized mode (`throughput_optimized: true`, gRPC
between the ingress and the replica, the ingress replica serving HTTP itself): the same answers, errors, key and
control plane as in the default mode, and a clean stop."""

from __future__ import annotations

import json
import time

import requests
from openai import OpenAI
from serve_process import API_KEY, free_port, serving, specserve_cli

MODEL = "specserve-tiny"
PROMPT = "def fibonacci(n):\n"


def replica_policy(env: dict[str, str]) -> str | None:
    done = specserve_cli(env, "status", "--json")
    replicas = json.loads(done.stdout)["replicas"] if done.returncode == 0 else []
    return replicas[0]["engine"]["policy"] if replicas else None


def test_the_throughput_optimized_mode_serves_the_same_endpoint(tmp_path, trained_pair):
    config = tmp_path / "serve.yaml"
    config.write_text("throughput_optimized: true\npolicy: fixed:k=3\n")
    args = ["--port", str(free_port()), "--metrics-port", str(free_port()), "--config", str(config)]
    with serving(args, tmp_path, SPECSERVE_API_KEY=API_KEY) as server:
        # Serve's controller says which mode it runs in.
        server.wait_for_line(r".*Throughput optimized Ray Serve enabled", timeout_s=60)
        client = OpenAI(base_url=server.endpoint, api_key=API_KEY)
        whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0)
        chunks = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stream=True)
        assert "".join(chunk.choices[0].text for chunk in chunks) == whole.choices[0].text
        assert whole.usage.completion_tokens == 24

        assert specserve_cli(server.env, "policy", "set", "fixed:k=0").returncode == 0
        deadline = time.monotonic() + 30
        while replica_policy(server.env) != "fixed:k=0":
            assert time.monotonic() < deadline, "the policy did not reach the replica through the mode's handles"
            time.sleep(0.5)
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
