"""specserve's HTTP ingress: Ray Serve LLM's OpenAI ingress with bounded request bodies, OpenAI-style errors on
every path and an optional API key.

``build_openai_app`` takes it as ``ingress_cls`` (its import path, ``app.INGRESS_CLS``),
so `specserve serve` and Serve config files get the same ingress. The request models stay vLLM's own (through Ray
Serve LLM); what they let through and vLLM or torch cannot take (integers past 64 bits, NaN, a top_k past int32)
is refused here with a 400 naming the field, before the request leaves the ingress.

Private Ray interfaces touched (Ray 2.60):

- ``ray/serve/_private/http_util.py`` ``ASGIAppReplicaWrapper._set_asgi_app(app)``: overridden, to install the
  error handlers and the key check on the replica's copy of the FastAPI app before its lifespan starts.
- ``ray/llm/_internal/serve/core/ingress/ingress.py`` ``OpenAiIngress`` and its ``completions`` / ``chat``
  (subclassed; ``make_fastapi_ingress`` reads the body type from their annotations), ``_get_model_id``'s
  HTTPException 404 (answered here as OpenAI's error object).
- ``ray/llm/_internal/common/errors.py`` ``VLLM_CLIENT_ERRORS``: vLLM's request errors.
- ``ray/llm/_internal/serve/core/configs/openai_api_models.py`` ``OpenAIHTTPException`` (what the parent's routes
  raise for an engine's error answer) and the "Message: ..., Internal exception: ..." form of its message; the
  ``{"error": {..., "code": <int>}}`` events its streams end with on an engine error.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import os
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterator
from functools import cache
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import SecretStr, TypeAdapter, ValidationError, model_validator
from ray.llm._internal.common.errors import VLLM_CLIENT_ERRORS
from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIHTTPException,
)
from ray.llm._internal.serve.core.ingress.ingress import OpenAiIngress
from ray.serve._private.http_util import ASGIAppReplicaWrapper
from ray.serve.exceptions import BackPressureError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

INT64 = (-(2**63), 2**63 - 1)
# vLLM keeps top_k per request in an int32 tensor.
INT32_MAX = 2**31 - 1
# OpenAI's own limit on `n`; each choice is a sequence the engine schedules, so a huge n would stall it.
MAX_N = 128

ERROR_TYPES = {401: "authentication_error", 404: "not_found_error", 408: "timeout_error", 429: "rate_limit_error"}
# What a request that failed because its replica's engine died carries, whichever layer saw it: vLLM's own
# errors (in the engine's replica) or Ray's (the replica actor itself gone).
ENGINE_GONE = ("EngineDeadError", "EngineCore encountered an issue", "ActorDiedError", "ActorUnavailableError")

logger = logging.getLogger("ray.serve")


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status)


@cache
def _field_adapter(model: Any, name: str) -> TypeAdapter[Any] | None:
    field = model.model_fields.get(name)
    return None if field is None else TypeAdapter(field.annotation)


def _check_shapes(model: Any, data: Any, handler: Callable[[Any], Any]) -> Any:
    """Each given field against its own type first, then the model. vLLM's before-validators read the raw body
    (they iterate `messages`, index `stream_options`) and a wrong type makes them raise TypeError, which pydantic
    does not turn into a validation error: a 500. Checked here, the same body gets a 400 naming the field."""
    if isinstance(data, dict):
        errors: list[Any] = []
        for name, value in data.items():
            adapter = _field_adapter(model, name) if isinstance(name, str) else None
            if adapter is None:
                continue
            try:
                adapter.validate_python(value)
            except ValidationError as exc:
                for e in exc.errors(include_url=False):
                    errors.append(
                        {"type": e["type"], "loc": (name, *e["loc"]), "input": e["input"]}
                        | ({"ctx": e["ctx"]} if "ctx" in e else {})
                    )
        if errors:
            try:
                failure = ValidationError.from_exception_data(model.__name__, errors)
            except (KeyError, TypeError, ValueError):  # an error type pydantic cannot rebuild: say it plainly
                raise ValueError(f"{errors[0]['loc'][0]}: invalid value") from None
            raise failure
    try:
        return handler(data)
    except VLLM_CLIENT_ERRORS as exc:  # vLLM's own checks, raised past pydantic: a 400 naming their parameter
        param = getattr(exc, "parameter", None)
        raise _value_error(param, str(exc.args[0]) if exc.args else str(exc), data) from None
    except (TypeError, AttributeError, KeyError, IndexError) as exc:  # a shape no field type describes
        raise ValueError(f"malformed request body: {exc}") from None


def _value_error(param: str | None, message: str, data: Any) -> ValidationError:
    loc = (param,) if param else ()
    value = data.get(param) if isinstance(data, dict) and param else None
    return ValidationError.from_exception_data(
        "request", [{"type": "value_error", "loc": loc, "input": value, "ctx": {"error": message}}]
    )


class BoundedCompletionRequest(CompletionRequest):
    @model_validator(mode="wrap")
    @classmethod
    def _shapes_first(cls, data: Any, handler: Callable[[Any], Any]) -> Any:
        return _check_shapes(cls, data, handler)


class BoundedChatCompletionRequest(ChatCompletionRequest):
    @model_validator(mode="wrap")
    @classmethod
    def _shapes_first(cls, data: Any, handler: Callable[[Any], Any]) -> Any:
        return _check_shapes(cls, data, handler)


class BadRequest(Exception):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param, self.message = param, message


def _leaves(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _leaves(item, f"{path}[{i}]")
    else:
        yield path, value


def check_bounds(body: CompletionRequest | ChatCompletionRequest) -> None:
    """Raise BadRequest naming the first value vLLM or torch could not take. The schema checks types; this
    checks sizes: Python's unbounded ints and JSON's NaN/Infinity pass pydantic, then overflow in the engine."""
    for name in body.model_fields_set:
        for path, value in _leaves(getattr(body, name), name):
            if isinstance(value, bool):
                continue
            if isinstance(value, int) and not INT64[0] <= value <= INT64[1]:
                raise BadRequest(path, f"{path}: {value} does not fit a 64-bit integer")
            if isinstance(value, float) and not math.isfinite(value):
                raise BadRequest(path, f"{path}: {value} is not a finite number")
    top_k = body.top_k
    if top_k is not None and top_k > INT32_MAX:
        raise BadRequest("top_k", f"top_k: {top_k} is more than {INT32_MAX}")
    n = body.n
    if n is not None and not 1 <= n <= MAX_N:
        raise BadRequest("n", f"n: {n} is not between 1 and {MAX_N}")


def _param(loc: tuple[Any, ...]) -> str | None:
    parts = [str(part) for part in loc if part != "body"]
    return ".".join(parts) or None


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    if not errors:
        return error_response(400, "invalid request body")
    first = errors[0]
    param = _param(tuple(first.get("loc", ())))
    if first.get("type") == "json_invalid":
        return error_response(400, f"request body is not valid JSON: {first.get('msg')}", code="invalid_json")
    # The offending input is left out of the message: it may be huge, or NaN, which JSON cannot carry.
    message = "; ".join(f"{_param(tuple(e.get('loc', ()))) or 'body'}: {e.get('msg')}" for e in errors[:5])
    return error_response(400, message, param=param, code="invalid_value")


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = "model_not_found" if exc.status_code == 404 and "model" in str(exc.detail) else None
    return error_response(exc.status_code, str(exc.detail), code=code)


async def _bad_request(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, BadRequest)
    return error_response(400, exc.message, param=exc.param, code="invalid_value")


class BearerAuth:
    """ASGI middleware: every HTTP request must carry ``Authorization: Bearer <key>``. The header is dropped once
    checked, so the key does not travel on to the engine replicas with the request."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app, self.key = app, key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = b""
        headers = []
        for name, value in scope["headers"]:
            if name.lower() == b"authorization":
                scheme, _, token = value.partition(b" ")
                given = token.strip() if scheme.lower() == b"bearer" else b""
            else:
                headers.append((name, value))
        if not hmac.compare_digest(given, self.key):
            message = "invalid API key" if given else "missing API key: send Authorization: Bearer <key>"
            response = error_response(401, message, code="invalid_api_key")
            response.headers["WWW-Authenticate"] = "Bearer"
            await response(scope, receive, send)
            return
        await self.app({**scope, "headers": headers}, receive, send)


def secure(app: FastAPI, api_key: str | None) -> FastAPI:
    """Install the error handlers and, with a key, the key check on the ingress's FastAPI app (before it starts)."""
    app.exception_handlers[RequestValidationError] = _validation_error
    app.exception_handlers[StarletteHTTPException] = _http_error
    app.exception_handlers[BadRequest] = _bad_request
    if api_key:
        app.add_middleware(BearerAuth, key=api_key)  # outermost: nothing runs for a request without the key
    return app


def server_failure(detail: str, retry_after_s: float) -> tuple[int, dict[str, Any], dict[str, str]]:
    """A failed request as its client sees it: status, OpenAI error object, headers. The engine gone (its replica
    is being replaced) is a 503 with Retry-After, as vLLM's own server answers an EngineDeadError; anything else
    a 500. Neither carries the detail: Ray Serve LLM's bodies hold whole tracebacks, which are the server's log's
    business, not a client's."""
    if any(marker in detail for marker in ENGINE_GONE):
        message = "the model replica's engine is unavailable (it failed and is being replaced); retry the request"
        return 503, error_body(503, message, code="engine_unavailable"), retry_after(retry_after_s)
    return 500, error_body(500, "internal server error; the details are in the server's log"), {}


async def answered(call: Awaitable[Response], retry_after_s: float) -> Response:
    """The route's response with every server-side failure, raised or streamed, as an OpenAI error object."""
    try:
        response = await call
    except (StarletteHTTPException, BadRequest, RequestValidationError):
        raise  # the client's mistakes: their own handlers answer them
    except BackPressureError as exc:  # overload (max_queued_requests): Serve's status and Retry-After, our body
        return overloaded(exc.status_code, exc.retry_after_s)
    except OpenAIHTTPException as exc:
        if exc.status_code < 500:  # the engine refused the request: its message, without Ray's wrapping
            return error_response(exc.status_code, _client_message(exc.message))
        return _failed(f"{exc.message} {exc.internal_message or ''}", exc, retry_after_s)
    except Exception as exc:
        return _failed(f"{type(exc).__name__}: {exc}", exc, retry_after_s)
    if isinstance(response, StreamingResponse):
        response.body_iterator = _guarded_stream(response.body_iterator, retry_after_s)
    return response


def overloaded(status: int, retry_after_s: float | None) -> JSONResponse:
    """A request refused past ``max_queued_requests``, as OpenAI's error object rather than Serve's plain text."""
    message = "the server is at capacity and its queue is full; retry the request later"
    headers = {} if retry_after_s is None else retry_after(retry_after_s)
    return JSONResponse(error_body(status, message, code="overloaded"), status_code=status, headers=headers)


def retry_after(seconds: float) -> dict[str, str]:
    """HTTP's Retry-After takes whole seconds: rounded up, as Serve's own header."""
    return {"Retry-After": str(max(0, math.ceil(seconds)))}


def _client_message(message: str) -> str:
    """Ray Serve LLM's "Message: M, Internal exception: ..., original exception: ..." as M alone."""
    if message.startswith("Message: ") and ", Internal exception: " in message:
        return message.removeprefix("Message: ").split(", Internal exception: ", 1)[0]
    return message


def _failed(detail: str, exc: BaseException, retry_after_s: float) -> JSONResponse:
    logger.error("specserve: request failed: %s", detail, exc_info=exc)
    status, body, headers = server_failure(detail, retry_after_s)
    return JSONResponse(body, status_code=status, headers=headers)


async def _guarded_stream(chunks: AsyncIterable[Any], retry_after_s: float) -> AsyncIterator[Any]:
    """A stream already answered 200 can only end with an error event: vLLM's convention, `data: {"error": ...}`
    then `data: [DONE]`. Server-side errors are rewritten as above; a stream cut by an exception gets both."""
    try:
        async for chunk in chunks:
            yield _clean_error_events(chunk, retry_after_s) if _has_error(chunk) else chunk
    except Exception as exc:
        logger.error("specserve: stream failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
        _, body, _ = server_failure(f"{type(exc).__name__}: {exc}", retry_after_s)
        yield f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n"


def _has_error(chunk: Any) -> bool:
    if isinstance(chunk, bytes):
        return b'"error"' in chunk
    return isinstance(chunk, str) and '"error"' in chunk


def _clean_error_events(chunk: str | bytes, retry_after_s: float) -> str:
    text = chunk.decode() if isinstance(chunk, bytes) else chunk
    events = []
    for event in text.split("\n\n"):
        payload = event.removeprefix("data: ")
        try:
            parsed = json.loads(payload) if payload != event and payload.startswith("{") else None
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and isinstance(error := parsed.get("error"), dict):
            code = error.get("code")
            if isinstance(code, int) and code >= 500:
                logger.error("specserve: stream failed: %s", error.get("message"))
                _, body, _ = server_failure(str(error.get("message")), retry_after_s)
                event = f"data: {json.dumps(body)}"
        events.append(event)
    return "\n\n".join(events)


class SpecServeIngress(OpenAiIngress):
    """Ray Serve LLM's ingress, its bodies bounded and its errors OpenAI's.

    ``api_key`` comes as a SecretStr bound into the deployment, whose repr is masked wherever Serve prints its
    arguments; without one, SPECSERVE_API_KEY in this replica's environment (the head node's), so that a Serve config
    file never has to hold the key."""

    def __init__(
        self,
        llm_deployments: dict[str, Any],
        model_cards: dict[str, Any],
        *,
        lora_paths: dict[str, str] | None = None,
        api_key: SecretStr | None = None,
        retry_after_s: float = 1.0,
    ) -> None:
        super().__init__(llm_deployments, model_cards, lora_paths=lora_paths)
        self._api_key = (
            api_key.get_secret_value() if api_key is not None else os.environ.get("SPECSERVE_API_KEY") or None
        )
        self._retry_after_s = retry_after_s

    def _set_asgi_app(self, app: Any) -> None:
        # Serve hands the replica its copy of the FastAPI app here, before the app's first (lifespan) call: the
        # last moment middleware can still be added, and the first at which this replica's key is known.
        if isinstance(app, FastAPI):
            app = secure(app, self._api_key)
        ASGIAppReplicaWrapper._set_asgi_app(self, app)

    async def completions(self, body: BoundedCompletionRequest, request: Request) -> Response:
        check_bounds(body)
        return await answered(super().completions(body, request), self._retry_after_s)

    async def chat(self, body: BoundedChatCompletionRequest, request: Request) -> Response:
        check_bounds(body)
        return await answered(super().chat(body, request), self._retry_after_s)
