"""Bad input and the API key against the package's live `specserve serve`, after the other modules used it:
property-based fuzzing of the OpenAI endpoints (every body gets a 2xx or a 4xx carrying an OpenAI error object,
never a 5xx, and the engine keeps serving), the key required on every route, and the key absent from logs, status
output and metrics."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from hypothesis import HealthCheck, given, seed, settings
from openai import AuthenticationError, OpenAI
from request_bodies import CHAT_BODIES, COMPLETION_BODIES
from serve_process import API_KEY as KEY

MODEL = "specserve-tiny"
# Bodies per endpoint; docs/user-guide/reliability.md states these numbers.
FUZZ_EXAMPLES = 1000


def post(server, path: str, body: object, key: str | None = KEY) -> requests.Response:
    data = body if isinstance(body, str) else json.dumps(body, allow_nan=True)
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    return requests.post(server.endpoint + path, data=data, headers=headers, timeout=120)


def assert_answered(response: requests.Response) -> None:
    """A 2xx, or a 4xx with OpenAI's error object; never a 5xx."""
    assert response.status_code < 500, f"{response.status_code}: {response.text[:500]}"
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["message"] and {"type", "param", "code"} <= set(error), error


FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@FUZZ
@seed(13)
@given(body=COMPLETION_BODIES)
def test_fuzzed_completion_bodies_get_a_2xx_or_an_openai_4xx(server, body):
    assert_answered(post(server, "/completions", body))


@FUZZ
@seed(13)
@given(body=CHAT_BODIES)
def test_fuzzed_chat_bodies_get_a_2xx_or_an_openai_4xx(server, body):
    assert_answered(post(server, "/chat/completions", body))


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/completions", {"model": MODEL, "prompt": "x", "top_k": 2**64}, "top_k"),
        ("/chat/completions", {"model": MODEL, "messages": -1}, "messages"),
        ("/chat/completions", {"model": MODEL, "messages": 5}, "messages"),
        ("/completions", {"model": 12, "prompt": "x"}, "model"),
        ("/completions", {"model": MODEL, "prompt": "x", "temperature": math.nan}, "temperature"),
    ],
)
def test_the_bodies_that_got_a_500_get_a_400_naming_the_field(server, path, body, param):
    response = post(server, path, body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_an_unknown_model_gets_an_openai_error_object(server):
    response = post(server, "/completions", {"model": "nope", "prompt": "x", "max_tokens": 2})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"


def test_every_route_wants_the_key(server):
    base = server.endpoint.removesuffix("/v1")
    for method, path in [
        ("GET", "/v1/models"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/tokenize"),
        ("GET", "/openapi.json"),
        ("GET", "/docs"),
    ]:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            response = requests.request(method, base + path, headers=headers, json={}, timeout=30)
            assert response.status_code == 401, (method, path, response.text)
            assert response.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=server.endpoint, api_key="wrong").models.list()


def test_the_openai_client_with_the_key_is_served(server):
    client = OpenAI(base_url=server.endpoint, api_key=KEY)
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.completions.create(model=MODEL, prompt="x", max_tokens=4).choices[0].text is not None


def test_the_public_port_serves_no_admin_route(server):
    """`policy set` and the controller's calls go through Ray to the controller actor, not over HTTP."""
    spec = requests.get(
        server.endpoint.removesuffix("/v1") + "/openapi.json", headers={"Authorization": f"Bearer {KEY}"}, timeout=30
    ).json()
    assert set(spec["paths"]) <= {
        "/v1/models",
        "/v1/models/{model}",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/embeddings",
        "/v1/audio/transcriptions",
        "/v1/score",
        "/tokenize",
        "/detokenize",
    }, sorted(spec["paths"])


def ray_logs(server) -> Path:
    """The serve's Ray session folder, as its processes name it."""
    for process in server.descendants():
        try:
            if found := re.search(r"--session[-_]dir=(\S+)", " ".join(process.cmdline())):
                return Path(found.group(1))
        except Exception:
            continue
    raise AssertionError("no Ray process of the serve names its session folder")


def test_the_key_appears_in_no_log_status_or_metrics(server):
    # Run last in the module, after the requests above and the other modules': whatever was logged is there.
    cli = [sys.executable, "-m", "specserve.cluster.cli"]
    status = subprocess.run([*cli, "status", "--json"], env=server.env, capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    metrics_url = server.line_matching(r"metrics: ").split()[1]
    places = {
        "serve output": server.tail(10**6),
        "status --json": status.stdout + status.stderr,
        "metrics": requests.get(metrics_url, timeout=30).text,
    }
    serve_status = subprocess.run(
        [
            sys.executable,
            "-c",
            "from specserve.cluster import control; control.connect(); from ray import serve; print(serve.status())",
        ],
        env=server.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    places["serve.status()"] = serve_status.stdout + serve_status.stderr
    for name, text in places.items():
        assert KEY not in text, name
    searched = 0
    for path in ray_logs(server).rglob("*"):
        if path.is_file() and not path.is_symlink():
            searched += 1
            assert KEY.encode() not in path.read_bytes(), path
    assert searched > 0


def test_rays_token_authentication_stays_on(server):
    """The local cluster keeps Ray's default, token authentication (Ray says so when it starts one); a serve that
    turned it off would have had to set RAY_AUTH_MODE, which the state file for `status` would then record."""
    assert server.line_matching(r".*Token authentication is enabled for this Ray cluster"), server.tail()
    state = json.loads((Path(server.env["SPECSERVE_STATE_DIR"]) / "cluster.json").read_text())
    assert state["ray_auth_mode"] in (None, "token")
