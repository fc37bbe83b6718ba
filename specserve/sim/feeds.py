"""Who sends which request when: an open loop's arrivals fixed in advance, or a closed loop of clients.

The kernel asks a feed for the requests to send at the start, after each arrival, after each step that finished
requests and at each change in the number of clients, and pushes an arrival for each.

A closed loop is the simulator's ``specserve bench --clients``: client i sends its next request the moment its
last one finishes while the schedule has more than i clients (``workload.clients_at``, which the load
generator reads too). When the count falls, the clients above it finish what they have in flight and sit out;
when it rises, the idle clients below it start at once. Nothing new is sent after the last phase. Requests are
numbered in the order they are sent, and their lengths and acceptance are drawn in chunks of a fixed size from
the workload's and the alpha's own streams, so request n is the same request under every policy (its alpha from
the acceptance regime in force when it is sent).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate

import numpy as np

from specserve.sim.batch import RequestTable
from specserve.sim.config import ClientsArrivals, WorkloadConfig
from specserve.sim.true_acceptance import TrueAcceptance
from specserve.sim.workload import Workload, clients_at, draw_lengths, fit_context

# Requests drawn at a time by a closed loop; a fixed size keeps request n's draws the same under every policy.
CHUNK = 1024

Sends = list[tuple[float, int]]  # (send time, request id)


class OpenLoop:
    """Arrival times fixed in advance: each arrival brings on the next."""

    def __init__(self, workload: Workload, table: RequestTable) -> None:
        self.workload, self.table = workload, table
        self._arrivals = workload.arrival_s.tolist()

    def start(self) -> Sends:
        return [(self._arrivals[0], 0)] if self._arrivals else []

    def changes_s(self) -> list[float]:
        return []

    def after_arrival(self, request: int) -> Sends:
        following = request + 1
        return [(self._arrivals[following], following)] if following < len(self._arrivals) else []

    def after_finish(self, requests: np.ndarray, now_s: float) -> Sends:
        return []

    def on_change(self, now_s: float) -> Sends:
        return []

    def finish(self) -> None:
        pass


class ClosedLoop:
    """Clients that send again as soon as they are answered; ``table`` grows as they send."""

    def __init__(
        self,
        cfg: WorkloadConfig,
        max_model_len: int,
        acceptance: TrueAcceptance,
        workload_rng: np.random.Generator,
        alpha_rng: np.random.Generator,
        check: Callable[[Workload], None],
    ) -> None:
        if not isinstance(cfg.arrivals, ClientsArrivals):
            raise TypeError(f"a closed loop needs arrivals kind 'clients', not {cfg.arrivals.kind!r}")
        self._phases = cfg.arrivals.phases
        self._cfg = cfg
        self._max_model_len = max_model_len
        self._acceptance = acceptance
        self._workload_rng, self._alpha_rng = workload_rng, alpha_rng
        self._check = check
        # Each drawn request's alpha under every acceptance regime, shape (regimes, drawn).
        self._alphas = np.zeros((0, 0))
        self._busy = [False] * max(phase.clients for phase in self._phases)
        self._client_of: list[int] = []
        self.table = RequestTable(Workload(np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64)), np.zeros(0))
        self.workload = self._workload(0)

    def start(self) -> Sends:
        return self.on_change(0.0)

    def changes_s(self) -> list[float]:
        return list(accumulate(phase.duration_s for phase in self._phases))

    def after_arrival(self, request: int) -> Sends:
        return []

    def after_finish(self, requests: np.ndarray, now_s: float) -> Sends:
        for request in requests.tolist():
            self._busy[self._client_of[request]] = False
        return self.on_change(now_s)

    def on_change(self, now_s: float) -> Sends:
        count, _ = clients_at(self._phases, now_s)
        return [self._send(client, now_s) for client in range(count) if not self._busy[client]]

    def finish(self) -> None:
        """Drop the requests drawn but never sent."""
        self.table.truncate(len(self._client_of))
        self.workload = self._workload(len(self._client_of))

    def _send(self, client: int, now_s: float) -> tuple[float, int]:
        request = len(self._client_of)
        if request == len(self.table.arrival_s):
            self._draw()
        self._busy[client] = True
        self._client_of.append(client)
        self.table.arrival_s[request] = now_s
        self.table.alpha[request] = self._alphas[self._acceptance.regime(now_s), request]
        return now_s, request

    def _draw(self) -> None:
        prompt, output = draw_lengths(self._cfg, CHUNK, self._workload_rng)
        chunk = fit_context(Workload(np.full(CHUNK, np.nan), prompt, output), self._max_model_len)
        self._check(chunk)
        alphas = self._acceptance.draw_alphas_by_regime(CHUNK, self._alpha_rng)
        self._alphas = alphas if not self._alphas.size else np.concatenate((self._alphas, alphas), axis=1)
        self.table.grow(chunk, np.full(CHUNK, np.nan))

    def _workload(self, count: int) -> Workload:
        t = self.table
        return Workload(t.arrival_s[:count], t.prompt_tokens[:count], t.output_tokens[:count])
