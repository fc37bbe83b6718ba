"""Serve tier: overload. With `deployment_config`'s `max_ongoing_requests` and `max_queued_requests` set, a burst
beyond what one replica holds and its queue takes is refused at once with the configured status, a message and
Retry-After, while every admitted request is answered."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from serve_process import ServeProcess, free_port

ONGOING, QUEUED, BURST = 2, 2, 12


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory, trained_pair):
    tmp = tmp_path_factory.mktemp("overload")
    config = tmp / "serve.yaml"
    config.write_text(
        f"engine_kwargs:\n  max_num_seqs: {ONGOING}\n"
        f"deployment_config:\n  max_ongoing_requests: {ONGOING}\n  max_queued_requests: {QUEUED}\n"
        "server:\n  overload_status: 429\n  retry_after_s: 2\n"
    )
    env = dict(os.environ, SPECSERVE_STATE_DIR=str(tmp / "state"))
    env.pop("RAY_ADDRESS", None)
    server = ServeProcess(
        ["--config", str(config), "--port", str(free_port()), "--metrics-port", str(free_port())],
        env,
        tmp / "serve.log",
    )
    try:
        yield server.start()
        assert server.stop() == 0
    finally:
        server.kill_tree()


def post(endpoint: str) -> tuple[requests.Response, float]:
    body = {"model": "specserve-tiny", "prompt": "def main():\n", "max_tokens": 96, "temperature": 0}
    response = requests.post(f"{endpoint}/completions", json=body, timeout=300)
    return response, time.monotonic()


def test_a_burst_past_the_queue_is_refused_at_once_and_every_admitted_request_is_answered(endpoint):
    with ThreadPoolExecutor(BURST) as pool:
        results = list(pool.map(lambda _: post(endpoint), range(BURST)))
    admitted = [(r, t) for r, t in results if r.status_code == 200]
    refused = [(r, t) for r, t in results if r.status_code != 200]
    assert all(r.status_code == 429 for r, _ in refused), [r.text for r, _ in refused]
    assert len(admitted) >= ONGOING and refused, f"{len(admitted)} admitted, {len(refused)} refused"
    for response, _ in refused:
        assert response.headers["Retry-After"] == "2"
        error = response.json()["error"]  # OpenAI's error object, as every other error of the endpoint
        assert error["code"] == "overloaded" and error["type"] == "rate_limit_error" and error["message"]
    # Refused on arrival, not after waiting behind the admitted ones.
    assert max(t for _, t in refused) < min(t for _, t in admitted)
    assert all(r.json()["usage"]["completion_tokens"] > 0 for r, _ in admitted)


def test_after_the_burst_a_request_is_admitted_again(endpoint):
    response, _ = post(endpoint)
    assert response.status_code == 200, response.text
