"""The ingress's own layer, without Serve: bounded bodies, OpenAI-style errors, the API key, and the routes it
serves. tests/serve/endpoint/test_robustness_and_key.py runs the same ingress inside `specserve serve`."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI, HTTPException, Request
from hypothesis import HealthCheck, given, seed, settings
from request_bodies import CHAT_BODIES, COMPLETION_BODIES
from starlette.testclient import TestClient

from specserve.replicas.serve.ingress import (
    BoundedChatCompletionRequest,
    BoundedCompletionRequest,
    SpecServeIngress,
    check_bounds,
    secure,
)

KEY = "sk-test-0123456789"


def small_app(api_key: str | None = None) -> FastAPI:
    """The ingress's body types and checks on stand-in routes that answer without an engine."""
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(body: BoundedCompletionRequest) -> dict:
        check_bounds(body)
        if body.model != "specserve-tiny":
            raise HTTPException(404, f'Could not find base model with ID "{body.model}".')
        return {"ok": True}

    @app.post("/v1/chat/completions")
    async def chat(body: BoundedChatCompletionRequest) -> dict:
        check_bounds(body)
        return {"ok": True}

    return secure(app, api_key)


def post(client: TestClient, path: str, body: object, **headers: str):
    data = body if isinstance(body, str) else json.dumps(body, allow_nan=True)
    return client.post(path, content=data, headers={"Content-Type": "application/json", **headers})


def assert_openai_error(response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not None:
        assert error["param"] == param
        assert param in error["message"]
    return error


CHAT = {"model": "specserve-tiny", "messages": [{"role": "user", "content": "hi"}]}
PROMPT = {"model": "specserve-tiny", "prompt": "x"}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", PROMPT | {"top_k": 2**64}, "top_k"),
        ("/v1/completions", PROMPT | {"top_k": 2**40}, "top_k"),
        ("/v1/completions", PROMPT | {"max_tokens": -(2**70)}, "max_tokens"),
        ("/v1/completions", PROMPT | {"temperature": float("nan")}, "temperature"),
        ("/v1/completions", PROMPT | {"logit_bias": {"5": float("inf")}}, "logit_bias.5"),
        ("/v1/completions", PROMPT | {"n": 10**6}, "n"),
        ("/v1/chat/completions", CHAT | {"seed": 2**64}, "seed"),
        ("/v1/chat/completions", {"model": "specserve-tiny", "messages": -1}, "messages"),
        ("/v1/chat/completions", {"model": "specserve-tiny", "messages": 3.5}, "messages"),
        ("/v1/chat/completions", CHAT | {"model": 7}, "model"),
        # vLLM's own checks raise past pydantic; they name their parameter too.
        ("/v1/completions", {"model": "specserve-tiny", "stop_token_ids": []}, "prompt"),
        ("/v1/chat/completions", CHAT | {"tools": []}, "tools"),
        ("/v1/chat/completions", CHAT | {"prompt_logprobs": -5}, "prompt_logprobs"),
    ],
)
def test_a_value_the_engine_cannot_take_gets_a_400_naming_the_field(path: str, body: dict, param: str) -> None:
    error = assert_openai_error(post(TestClient(small_app()), path, body), 400)
    assert error["param"] == param or error["param"].startswith(param), error


def test_a_body_that_is_not_json_gets_an_openai_error() -> None:
    error = assert_openai_error(post(TestClient(small_app()), "/v1/completions", '{"model": '), 400)
    assert error["code"] == "invalid_json"


def test_unknown_model_and_unknown_path_get_openai_errors_not_fastapis_detail() -> None:
    client = TestClient(small_app())
    error = assert_openai_error(post(client, "/v1/completions", PROMPT | {"model": "nope"}), 404)
    assert error["code"] == "model_not_found" and "nope" in error["message"]
    assert_openai_error(client.get("/v1/nothing-here"), 404)
    assert_openai_error(client.get("/v1/completions"), 405)


def test_without_a_key_configured_the_endpoint_is_open() -> None:
    assert post(TestClient(small_app()), "/v1/completions", PROMPT).json() == {"ok": True}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": KEY},
        {"Authorization": f"Basic {KEY}"},
        {"Authorization": f"Bearer {KEY}x"},
        {"Authorization": "Bearer "},
    ],
)
def test_with_a_key_every_request_without_it_gets_a_401(headers: dict) -> None:
    client = TestClient(small_app(KEY))
    for response in (post(client, "/v1/completions", PROMPT, **headers), client.get("/docs", headers=headers)):
        error = assert_openai_error(response, 401)
        assert error["code"] == "invalid_api_key"
        assert response.headers["WWW-Authenticate"] == "Bearer"
        assert KEY not in response.text


def test_with_the_key_requests_go_through_and_the_header_stops_at_the_ingress() -> None:
    app = small_app(KEY)
    seen: list[dict] = []

    @app.get("/v1/echo-headers")
    async def echo(request: Request) -> dict:
        seen.append(dict(request.headers))
        return {}

    client = TestClient(app)
    assert post(client, "/v1/completions", PROMPT, Authorization=f"Bearer {KEY}").json() == {"ok": True}
    assert client.get("/v1/echo-headers", headers={"Authorization": f"bearer {KEY}"}).status_code == 200
    assert "authorization" not in seen[0]


def test_the_ingress_serves_only_openai_routes_and_its_docs() -> None:
    """Admin actions (`policy set`, the controller's calls) go through Ray to the controller actor: no HTTP route
    of the public port reaches them."""
    from ray.llm._internal.serve.core.ingress.ingress import make_fastapi_ingress

    app = FastAPI()
    make_fastapi_ingress(SpecServeIngress, app=app)
    paths = {route.path for route in app.routes}
    assert paths == {
        "/v1/models",
        "/v1/models/{model:path}",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/embeddings",
        "/v1/audio/transcriptions",
        "/v1/score",
        "/tokenize",
        "/detokenize",
        "/openapi.json",
        "/docs",
        "/docs/oauth2-redirect",
        "/redoc",
    }


# Bodies per endpoint, in-process: the ingress's own layer (types, vLLM's request checks, bounds) answers without
# an engine, so many more run here than against the live serve.
LAYER_EXAMPLES = 1000
LAYER = settings(max_examples=LAYER_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
LAYER_CLIENT = TestClient(small_app(), raise_server_exceptions=False)


def assert_no_5xx(path: str, body: dict) -> None:
    response = post(LAYER_CLIENT, path, body)
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert response.json()["error"]["message"]


@LAYER
@seed(13)
@given(body=COMPLETION_BODIES)
def test_fuzzed_completion_bodies_never_get_a_5xx_from_the_ingress(body: dict) -> None:
    assert_no_5xx("/v1/completions", body)


@LAYER
@seed(13)
@given(body=CHAT_BODIES)
def test_fuzzed_chat_bodies_never_get_a_5xx_from_the_ingress(body: dict) -> None:
    assert_no_5xx("/v1/chat/completions", body)
