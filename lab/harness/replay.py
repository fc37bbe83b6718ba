"""Drive an in-process engine in real time with a trace or a closed loop of clients, and keep its step log (the
engine half of the simulator-vs-engine check, ``bench/engine_check.py``; the simulator half is
``lab/experiments/engine_check.py``).

Every request is random prompt token ids of the given length, greedy, ``ignore_eos``, ``max_tokens`` = the
output length. A trace (``replay``) adds each request once its arrival time has passed; a closed loop
(``replay_clients``) sends a client's next request the moment its last one finishes, as the simulator's closed
loop and ``specserve bench --clients`` do. The engine keeps a bounded ring of step records, so the log is
collected as the run goes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from specserve.replicas.tools import offline

# Steps between two collections of the engine's step log; far below its ring's size.
COLLECT_EVERY = 512
# Longest sleep while the engine is idle and nothing is due: how late an arrival or a phase change can be seen.
IDLE_POLL_S = 0.05


class _Load(Protocol):
    def due(self, now_s: float) -> list[tuple[int, float, int, int]]:
        """Requests to send now: (index, arrival_s, prompt_tokens, output_tokens)."""

    def finished(self, index: int) -> None: ...

    def next_s(self, now_s: float) -> float:
        """When something may next be due with the engine idle; inf once nothing more will be sent."""


class _Trace:
    def __init__(self, rows: Sequence[tuple[float, int, int]]) -> None:
        self._rows = rows
        self._next = 0  # the first row not yet sent

    def due(self, now_s: float) -> list[tuple[int, float, int, int]]:
        start = self._next
        while self._next < len(self._rows) and self._rows[self._next][0] <= now_s:
            self._next += 1
        return [(i, *self._rows[i]) for i in range(start, self._next)]

    def finished(self, index: int) -> None:
        pass

    def next_s(self, now_s: float) -> float:
        return self._rows[self._next][0] if self._next < len(self._rows) else math.inf


class _Clients:
    """Client i is busy from its send to its request's finish and sends again while the schedule has more
    than i clients; when the count falls the clients above it finish what they have in flight."""

    def __init__(self, schedule: Callable[[float], tuple[int, float]], prompt_tokens: int, output_tokens: int):
        self._schedule = schedule
        self._lengths = (prompt_tokens, output_tokens)
        self._client_of: list[int] = []
        self._busy: set[int] = set()

    def due(self, now_s: float) -> list[tuple[int, float, int, int]]:
        count, _ = self._schedule(now_s)
        out = []
        for client in range(count):
            if client not in self._busy:
                self._busy.add(client)
                self._client_of.append(client)
                out.append((len(self._client_of) - 1, now_s, *self._lengths))
        return out

    def finished(self, index: int) -> None:
        self._busy.discard(self._client_of[index])

    def next_s(self, now_s: float) -> float:
        count, change_s = self._schedule(now_s)
        return now_s if count > len(self._busy) else change_s


def replay(
    llm: Any, rows: Sequence[tuple[float, int, int]], policy: str, vocab: int, warm_start: bool = True
) -> tuple[list[dict], float, list[float]]:
    """``rows`` are (arrival_s, prompt_tokens, output_tokens), by arrival. Returns the run's step log (each
    entry with ``t_s`` from the first step), the makespan from the start and each request's end-to-end
    seconds from its arrival. ``warm_start`` as in ``offline.set_policy``."""
    return _drive(llm, _Trace(rows), policy, vocab, warm_start)


def replay_clients(
    llm: Any,
    schedule: Callable[[float], tuple[int, float]],
    prompt_tokens: int,
    output_tokens: int,
    policy: str,
    vocab: int,
    warm_start: bool = True,
) -> tuple[list[dict], float, list[float]]:
    """A closed loop: ``schedule(t)`` gives the client count ``t`` seconds into the run and when it next
    changes (count 0 and inf after the last phase: ``sim.workload.clients_at``). Returns as ``replay`` does,
    end-to-end seconds counted from each request's send."""
    return _drive(llm, _Clients(schedule, prompt_tokens, output_tokens), policy, vocab, warm_start)


def _drive(llm: Any, load: _Load, policy: str, vocab: int, warm_start: bool) -> tuple[list[dict], float, list[float]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    offline.set_policy(llm, policy, warm_start)
    # Every run sends the same prompts (the same seed): none may find another run's prefill in the cache.
    llm.reset_prefix_cache()
    cursor = offline.read_telemetry(llm).speculation.num_steps
    engine = llm.llm_engine
    rng = np.random.default_rng(0)
    log: list[dict] = []
    arrival_of: dict[int, float] = {}
    e2e: list[float] = []
    steps = 0
    started = time.monotonic()
    while True:
        now = time.monotonic() - started
        for i, arrival_s, prompt_tokens, output_tokens in load.due(now):
            ids = rng.integers(3, vocab, size=prompt_tokens).tolist()
            params = SamplingParams(temperature=0.0, max_tokens=output_tokens, ignore_eos=True)
            engine.add_request(f"replay-{i}", TokensPrompt(prompt_token_ids=ids), params)
            arrival_of[i] = arrival_s
        if engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    index = int(out.request_id.removeprefix("replay-"))
                    e2e.append(time.monotonic() - started - arrival_of[index])
                    load.finished(index)
            steps += 1
            if steps % COLLECT_EVERY == 0:
                cursor = _collect(llm, log, cursor)
        elif (next_s := load.next_s(now)) < math.inf:
            time.sleep(min(IDLE_POLL_S, max(0.0, next_s - now)))
        else:
            break
    makespan = time.monotonic() - started
    _collect(llm, log, cursor)
    for entry in log:
        entry["t_s"] = entry["now_s"] - (log[0]["now_s"] if log else 0.0)
    return log, makespan, e2e


def _collect(llm: Any, log: list[dict], cursor: int) -> int:
    new = offline.read_step_log(llm, cursor)
    log.extend(new)
    return cursor + len(new)
