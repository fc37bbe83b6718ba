"""Closed-loop HTTP clients for the fault and cluster tests: every request's start and end, and how it ended."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Self

import requests

MODEL = "specserve-tiny"
# Far above any request's latency here (a few seconds): a request that reaches it has hung.
CLIENT_TIMEOUT_S = 150.0


@dataclass(frozen=True, slots=True)
class Outcome:
    start_s: float
    end_s: float
    status: int | None  # None: the client got an exception, named in ``detail``
    detail: str

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def timed_out(self) -> bool:
        return self.status is None and "Timeout" in self.detail


class ClientThreads:
    """Client threads started on enter (the clock starts then), stopped and joined on exit: none may still be
    waiting on a request by then."""

    started_s: float
    _stop: threading.Event

    def num_clients(self) -> int:
        raise NotImplementedError

    def _client(self, index: int) -> None:
        raise NotImplementedError

    def now(self) -> float:
        return time.monotonic() - self.started_s

    def __enter__(self) -> Self:
        self.started_s = time.monotonic()
        self._threads = [
            threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(self.num_clients())
        ]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=CLIENT_TIMEOUT_S + 30)
        assert not any(t.is_alive() for t in self._threads), "a client is still waiting on its request"


@dataclass
class Load(ClientThreads):
    """Closed-loop clients; every request's start and end (seconds since the load began) and how it ended."""

    endpoint: str
    clients: int
    started_s: float = field(default_factory=time.monotonic)
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def num_clients(self) -> int:
        return self.clients

    def _client(self, index: int) -> None:
        body = {"model": MODEL, "prompt": "def fib(n):", "max_tokens": 32, "temperature": 0}
        while not self._stop.is_set():
            start = self.now()
            try:
                response = requests.post(f"{self.endpoint}/completions", json=body, timeout=CLIENT_TIMEOUT_S)
                status, detail = response.status_code, response.text[:20000]
            except requests.RequestException as exc:
                status, detail = None, f"{type(exc).__name__}: {exc}"[:200]
            self.outcomes.append(Outcome(start, self.now(), status, detail))
            if status != 200:
                time.sleep(0.2)  # a replica that is down answers at once; do not spin on it

    def wait_answered(self, count: int, after_s: float = 0.0, timeout_s: float = 120.0) -> Outcome:
        """The ``count``-th answered request among those sent after ``after_s``."""
        deadline = time.monotonic() + timeout_s
        while len(answered := [o for o in list(self.outcomes) if o.ok and o.start_s > after_s]) < count:
            assert time.monotonic() < deadline, f"fewer than {count} requests answered in {timeout_s} s"
            time.sleep(0.2)
        return sorted(answered, key=lambda o: o.end_s)[count - 1]
