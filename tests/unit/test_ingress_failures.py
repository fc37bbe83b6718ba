"""Server-side failures as the ingress answers them: a dead engine is a 503 with Retry-After, anything else a 500,
both OpenAI error objects without the traceback Ray Serve LLM puts in its bodies; streams end with an error
event and [DONE]; a request refused past the queue keeps Serve's status and Retry-After. tests/serve/test_faults.py
and test_overload.py check the same answers on the real stack."""

from __future__ import annotations

import json

from fastapi import FastAPI, HTTPException
from ray.llm._internal.serve.core.configs.openai_api_models import OpenAIHTTPException
from ray.serve.exceptions import BackPressureError
from starlette.responses import StreamingResponse
from starlette.testclient import TestClient

from specserve.replicas.serve.ingress import answered, secure

# What Ray Serve LLM's ingress raised for a request in flight on a killed engine (a test_faults run), shortened.
ENGINE_DEAD = (
    "Message: Internal Server Error, Internal exception: Traceback (most recent call last):\n"
    '  File "/venv/lib/python3.11/site-packages/vllm/v1/engine/async_llm.py", line 612, in generate\n'
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace for the root cause."
)
SECRET_DETAIL = "psycopg: password=hunter2 at /srv/internal/path.py"


def app_raising(exc: Exception, retry_after_s: float = 2.0) -> TestClient:
    app = FastAPI()

    async def fails():
        raise exc

    @app.post("/v1/completions")
    async def completions():
        return await answered(fails(), retry_after_s)

    return TestClient(secure(app, None), raise_server_exceptions=False)


def app_streaming(chunks: list[str], then: Exception | None = None) -> TestClient:
    app = FastAPI()

    async def stream():
        for chunk in chunks:
            yield chunk
        if then is not None:
            raise then

    async def ok():
        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions():
        return await answered(ok(), 3.0)

    return TestClient(secure(app, None), raise_server_exceptions=False)


def openai_error(body: dict) -> dict:
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "Traceback" not in error["message"] and "File " not in error["message"]
    return error


def events(text: str) -> list[str]:
    return [line.removeprefix("data: ") for line in text.split("\n\n") if line.startswith("data: ")]


def test_a_dead_engine_is_a_503_with_retry_after_and_no_traceback() -> None:
    exc = OpenAIHTTPException(message=ENGINE_DEAD, status_code=500, type="InternalServerError")
    response = app_raising(exc, retry_after_s=1.5).post("/v1/completions")
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "2"  # HTTP takes whole seconds
    error = openai_error(response.json())
    assert error["code"] == "engine_unavailable" and error["type"] == "server_error"


def test_a_replica_actor_gone_is_a_503_too() -> None:
    class ActorDiedError(Exception):  # Ray's, as the handle raises it when the replica actor is gone
        pass

    response = app_raising(ActorDiedError("The actor died unexpectedly before finishing this task.")).post(
        "/v1/completions"
    )
    assert response.status_code == 503
    assert openai_error(response.json())["code"] == "engine_unavailable"


def test_any_other_server_failure_is_a_500_that_leaves_its_detail_in_the_log() -> None:
    for exc in (RuntimeError(SECRET_DETAIL), OpenAIHTTPException(message=SECRET_DETAIL, status_code=502)):
        response = app_raising(exc).post("/v1/completions")
        assert response.status_code == 500
        assert "Retry-After" not in response.headers
        assert "hunter2" not in response.text and "/srv/internal" not in response.text
        openai_error(response.json())


def test_client_errors_pass_through_to_their_own_handlers() -> None:
    response = app_raising(HTTPException(404, 'Could not find base model with ID "x".')).post("/v1/completions")
    assert response.status_code == 404
    assert openai_error(response.json())["code"] == "model_not_found"
    wrapped = "Message: prompt too long, Internal exception: Traceback ..., original exception: ValueError"
    response = app_raising(OpenAIHTTPException(message=wrapped, status_code=400)).post("/v1/completions")
    assert response.status_code == 400
    assert openai_error(response.json())["message"] == "prompt too long"


def test_a_stream_cut_by_a_dead_engine_ends_with_an_error_event_and_done() -> None:
    first = 'data: {"choices": [{"text": "def"}]}\n\n'
    response = app_streaming([first], then=RuntimeError(ENGINE_DEAD)).post("/v1/completions")
    assert response.status_code == 200  # already sent when the engine died
    got = events(response.text)
    assert got[0] == '{"choices": [{"text": "def"}]}'
    assert openai_error(json.loads(got[1]))["code"] == "engine_unavailable"
    assert got[2:] == ["[DONE]"]


def test_an_error_event_from_the_engine_loses_its_traceback_and_client_errors_stay() -> None:
    dead = json.dumps({"error": {"message": ENGINE_DEAD, "type": "InternalServerError", "code": 500}})
    bad = json.dumps({"error": {"message": "bad logprobs", "type": "BadRequestError", "code": 400}})
    text = json.dumps({"choices": [{"text": 'raise "error" {'}]})  # a completion that mentions an error
    chunks = [f"data: {dead}\n\n", f"data: {text}\n\n", f"data: {bad}\n\ndata: [DONE]\n\n"]
    got = events(app_streaming(chunks).post("/v1/completions").text)
    assert openai_error(json.loads(got[0]))["code"] == "engine_unavailable"
    assert got[1:] == [text, bad, "[DONE]"]


def test_a_request_past_the_queue_is_refused_with_serves_status_and_retry_after_in_an_openai_error() -> None:
    for status, kind in ((429, "rate_limit_error"), (503, "server_error")):
        exc = BackPressureError(num_queued_requests=4, max_queued_requests=4, status_code=status, retry_after_s=1.5)
        response = app_raising(exc).post("/v1/completions")
        assert response.status_code == status
        assert response.headers["Retry-After"] == "2"  # whole seconds, rounded up, as Serve's own header
        error = openai_error(response.json())
        assert error["code"] == "overloaded" and error["type"] == kind
