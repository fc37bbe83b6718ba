"""Sending the requests: vLLM's own request functions, driven by our schedules.

Each request goes through ``vllm.benchmarks.lib.endpoint_request_func.async_request_openai_completions``
(or ``..._chat_completions``), the functions behind ``vllm bench serve``: same payload (streaming, usage
included), same clock points for TTFT, ITL and E2E, so our numbers compare with everyone's. We do not use
``vllm.benchmarks.serve.benchmark()`` itself: it has no closed loop over a duration, no piecewise rate
schedule, replays only its own dataset formats, needs a tokenizer, and prints its report to stdout.

Around each call we add what the request function lacks: a per-request deadline (``asyncio.wait_for``;
its own session timeout is six hours) and the HTTP status or connection exception, which it reduces to a
reason phrase or a traceback. aiohttp's trace hooks see both; a context variable ties them to the request
(each client loop and each open-loop request runs in a task of its own, so the variable is per request).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from tqdm import tqdm
from vllm.benchmarks.lib.endpoint_request_func import (
    RequestFuncInput,
    RequestFuncOutput,
    async_request_openai_chat_completions,
    async_request_openai_completions,
)

from specserve.bench.load import BenchError, Plan
from specserve.bench.workload import PromptRequest, Workload

# Names in the tracebacks vLLM's request function keeps when the stream breaks after the status line.
_CONNECTION_ERRORS = (
    "ClientConnectorError",
    "ServerDisconnectedError",
    "ClientPayloadError",
    "ClientOSError",
    "ConnectionResetError",
    "ConnectionRefusedError",
    "ConnectionError",
)


@dataclass(frozen=True, slots=True)
class Target:
    base_url: str  # ending in /v1
    model: str
    api: str = "completions"  # or "chat"
    ignore_eos: bool = True
    temperature: float = 0.0
    timeout_s: float = 300.0
    # vLLM's prefix-cache namespace, sent with every request: a request hits only KV blocks that requests with the
    # same salt filled (`bench compare` gives each run its own). None: the server's shared cache.
    cache_salt: str | None = None

    @property
    def url(self) -> str:
        return f"{self.base_url}/{'chat/completions' if self.api == 'chat' else 'completions'}"


@dataclass(slots=True)
class Outcome:
    """One request: vLLM's output record, our error kind (None on success) and when it was due and sent."""

    index: int
    max_tokens: int
    output: RequestFuncOutput
    error_kind: str | None
    scheduled_s: float | None  # open loop: its arrival time; closed loop: None
    sent_s: float  # from the start of the run
    request_class: str | None = None  # the mixed workload's class (``workload``)


@dataclass(slots=True)
class _Call:
    status: int | None = None
    exception: BaseException | None = None


_CALL: ContextVar[_Call | None] = ContextVar("specserve_bench_call", default=None)


def _trace_config() -> aiohttp.TraceConfig:
    async def on_end(session: Any, ctx: Any, params: aiohttp.TraceRequestEndParams) -> None:
        if (call := _CALL.get()) is not None:
            call.status = params.response.status

    async def on_exception(session: Any, ctx: Any, params: aiohttp.TraceRequestExceptionParams) -> None:
        if (call := _CALL.get()) is not None:
            call.exception = params.exception

    config = aiohttp.TraceConfig()
    config.on_request_end.append(on_end)
    config.on_request_exception.append(on_exception)
    return config


def classify(output: RequestFuncOutput, status: int | None, exception: BaseException | None) -> str | None:
    """The error kind of a finished request: None, ``http_<status>``, ``connection``, ``empty_stream``, ``other``."""
    if output.success:
        return None
    if status is not None and status != 200:
        return f"http_{status}"
    if exception is not None or any(name in output.error for name in _CONNECTION_ERRORS):
        return "connection"
    if "Never received a valid chunk" in output.error:
        return "empty_stream"
    return "other"


def auth_headers() -> dict[str, str]:
    """The bearer token from ``OPENAI_API_KEY``, as vLLM's request functions send it on every request, for the two
    calls we make ourselves (``GET /models`` and the probe): a server that requires a key answers them too."""
    key = os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _key_hint() -> str:
    if os.environ.get("OPENAI_API_KEY"):
        return "the server refused the key in OPENAI_API_KEY"
    return "the server wants an API key; export OPENAI_API_KEY"


def session(timeout_s: float) -> aiohttp.ClientSession:
    # No pool limit: the schedule, not the connector, decides how many requests are in flight.
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(10.0, timeout_s))
    connector = aiohttp.TCPConnector(limit=0)
    return aiohttp.ClientSession(timeout=timeout, connector=connector, trace_configs=[_trace_config()])


async def send(http: aiohttp.ClientSession, target: Target, prompt: str, prompt_len: int, max_tokens: int):
    """One request through vLLM's request function; returns its output and error kind."""
    call = _Call()
    _CALL.set(call)
    request = RequestFuncInput(
        prompt=prompt,
        api_url=target.url,
        prompt_len=prompt_len,
        output_len=max_tokens,
        model=target.model,
        ignore_eos=target.ignore_eos,
        extra_body={"temperature": target.temperature}
        | ({"cache_salt": target.cache_salt} if target.cache_salt is not None else {}),
    )
    func = async_request_openai_chat_completions if target.api == "chat" else async_request_openai_completions
    started = time.perf_counter()
    try:
        output = await asyncio.wait_for(func(request, http), target.timeout_s)
    except TimeoutError:
        error = f"no complete response within --timeout {target.timeout_s:g} s"
        return RequestFuncOutput(prompt_len=prompt_len, start_time=started, error=error), "timeout"
    return output, classify(output, call.status, call.exception)


@dataclass
class Runner:
    """Runs a plan against a target; ``run`` returns the outcomes in send order and the run's duration."""

    target: Target
    prompter: Workload
    progress: bool = True
    outcomes: list[Outcome] = field(default_factory=list)

    async def run(self, plan: Plan) -> tuple[list[Outcome], float]:
        total = len(plan.arrival_s) if plan.arrival_s is not None else plan.num_requests
        # The bar is the only thing on stderr while the run goes; stdout stays for the report.
        self.bar = tqdm(total=total, unit="req", file=sys.stderr, disable=not self.progress, dynamic_ncols=True)
        async with session(self.target.timeout_s) as http:
            if plan.arrival_s is None:
                duration_s = await self._closed(http, plan)
            else:
                duration_s = await self._open(http, plan)
        self.bar.close()
        return sorted(self.outcomes, key=lambda o: o.index), duration_s

    async def _one(
        self, http: Any, plan: Plan, index: int, prompt: PromptRequest, start: float, due: float | None
    ) -> None:
        max_tokens = plan.lengths(index)[1]
        sent_s = time.perf_counter() - start
        output, kind = await send(http, self.target, prompt.text, prompt.prompt_tokens, max_tokens)
        self.outcomes.append(Outcome(index, max_tokens, output, kind, due, sent_s, prompt.request_class))
        self.bar.update(1)

    async def _closed(self, http: Any, plan: Plan) -> float:
        counter = itertools.count()

        async def client(seat: int) -> None:
            while True:
                now_s = time.perf_counter() - start
                if plan.duration_s is not None and now_s >= plan.duration_s:
                    return
                clients, change_s = plan.clients_at(now_s)
                if seat >= clients:  # not wanted in this phase of a schedule: wait for the next
                    await asyncio.sleep(change_s - now_s)
                    continue
                index = next(counter)
                if plan.num_requests is not None and index >= plan.num_requests:
                    return
                prompt = self.prompter.request(index, plan.lengths(index)[0])
                await self._one(http, plan, index, prompt, start, None)

        start = time.perf_counter()
        await asyncio.gather(*(client(seat) for seat in range(plan.concurrency)))
        return time.perf_counter() - start

    async def _open(self, http: Any, plan: Plan) -> float:
        assert plan.arrival_s is not None
        # Prompts first, so making them (a tokenizer is slow) cannot delay an arrival.
        prompts = [self.prompter.request(i, plan.lengths(i)[0]) for i in range(len(plan.arrival_s))]
        tasks = []
        start = time.perf_counter()
        for index, due in enumerate(plan.arrival_s.tolist()):
            if (delay := start + due - time.perf_counter()) > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(self._one(http, plan, index, prompts[index], start, due)))
        await asyncio.gather(*tasks)
        return time.perf_counter() - start


async def first_model(base_url: str, timeout_s: float) -> str:
    """The first model ``GET /models`` lists, as ``vllm bench serve`` picks it when none is given."""
    async with session(timeout_s) as http:
        try:
            async with asyncio.timeout(timeout_s), http.get(f"{base_url}/models", headers=auth_headers()) as response:
                if response.status in (401, 403):
                    raise BenchError(f"--url {base_url}: GET /models gave HTTP {response.status}: {_key_hint()}")
                if response.status != 200:
                    raise BenchError(f"--url {base_url}: GET /models gave HTTP {response.status}; pass --model")
                models = (await response.json()).get("data") or []
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            raise BenchError(f"--url {base_url}: cannot list models ({type(exc).__name__}: {exc})") from None
    if not models:
        raise BenchError(f"--url {base_url}: the server lists no model; pass --model")
    return str(models[0]["id"])


async def probe(target: Target) -> tuple[bool, str | None]:
    """One short request before the run: is the URL reachable, and does the server take ``ignore_eos``?

    Returns the ``ignore_eos`` to use and a note for stderr. An unreachable URL is a BenchError; an HTTP
    error is only a note, since the run counts errors by kind (a wrong model gives 404 on every request).
    """
    status, body = await _probe_once(target, target.ignore_eos)
    if status in (401, 403):
        # Every request would be refused the same way: a run of them measures nothing.
        raise BenchError(f"--url {target.base_url}: the probe request got HTTP {status}: {_key_hint()}")
    if status in (400, 422) and target.ignore_eos:
        # Not every OpenAI-compatible server knows vLLM's ignore_eos; without it lengths may fall short.
        retry_status, _ = await _probe_once(target, False)
        if retry_status == 200:
            return False, f"the server rejects ignore_eos (HTTP {status}); sending without it"
    if status != 200:
        return target.ignore_eos, f"probe request got HTTP {status}: {body[:200]}; running anyway"
    return target.ignore_eos, None


async def _probe_once(target: Target, ignore_eos: bool) -> tuple[int, str]:
    payload: dict[str, Any] = {"model": target.model, "max_tokens": 1, "temperature": target.temperature}
    if target.api == "chat":
        payload["messages"] = [{"role": "user", "content": "Hello"}]
    else:
        payload["prompt"] = "Hello"
    if ignore_eos:
        payload["ignore_eos"] = True
    # At least 30 s: a short --timeout is for the run's requests, and a cold server may be slow once.
    limit_s = max(target.timeout_s, 30.0)
    async with session(limit_s) as http:
        try:
            async with (
                asyncio.timeout(limit_s),
                http.post(target.url, json=payload, headers=auth_headers()) as response,
            ):
                return response.status, await response.text()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise BenchError(f"--url {target.base_url}: unreachable ({type(exc).__name__}: {exc})") from None
