"""Which replica an arriving request goes to: the fewest outstanding requests, or speculation-aware.

``least_outstanding`` has been the simulator's router from the start: the replica with the fewest running plus
waiting requests, the lowest index on ties. It stands in for Ray Serve's default router, which samples two
replicas and takes the shorter queue; this one sees every replica.

``speculation_aware`` (the open issue): a latency-sensitive request goes to the least-loaded replica whose draft is
resident, where speculation can shorten its decode; a batch request to the least-loaded replica whose draft is
offloaded, whose KV pool is expanded, so long contexts land where the room is. Each falls back to the
least-outstanding choice when no replica qualifies, or when the preferred one holds more than ``max_imbalance``
outstanding requests over the least-loaded one: the imbalance stays bounded, so no replica is flooded for being in
the right state nor starved for being in the wrong one.

The class is the one the client gave at arrival (``Workload.batch``), not the output length: no router knows how
long a request will run before it ends (``max_tokens`` is only a cap).

The rule reads only what a replica reports (``RoutedReplica``): outstanding requests, whether its draft is resident,
whether its pool is expanded. Pure, so a Ray Serve request router could call ``speculation_aware`` on its replicas'
telemetry; it never reads state a replica does not have.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from enum import Enum
from operator import attrgetter
from typing import Protocol, TypeVar

import numpy as np

from specserve.sim.batch import Column
from specserve.sim.config import RouterConfig


class RoutedReplica(Protocol):
    @property
    def num_outstanding(self) -> int: ...

    @property
    def draft_resident(self) -> bool:
        """Speculation is possible (k > 0 allowed)."""
        ...

    @property
    def kv_expanded(self) -> bool:
        """The draft is offloaded and its memory lent to the KV pool."""
        ...


R = TypeVar("R", bound=RoutedReplica)


class Route(Enum):
    """How a speculation-aware choice came about."""

    # A replica of the preferred kind that is also the least-loaded one: the same choice as least_outstanding.
    PREFERRED = "preferred"
    # A replica of the preferred kind other than the least-loaded one, within the imbalance bound.
    DIVERTED = "diverted"
    # Fallbacks to the least-loaded replica.
    NO_CANDIDATE = "no_candidate"
    IMBALANCE = "imbalance"


# The first replica with the fewest outstanding requests; attrgetter reads the property without a lambda's frame
# (every arrival scans every replica).
_OUTSTANDING = attrgetter("num_outstanding")


def least_outstanding(replicas: Sequence[R]) -> R:
    return min(replicas, key=_OUTSTANDING)


def speculation_aware(replicas: Sequence[R], batch: bool, max_imbalance: int) -> tuple[R, Route]:
    least = least_outstanding(replicas)
    candidates = [r for r in replicas if (r.kv_expanded if batch else r.draft_resident)]
    if not candidates:
        return least, Route.NO_CANDIDATE
    preferred = least_outstanding(candidates)
    if preferred is least:
        return least, Route.PREFERRED
    if preferred.num_outstanding - least.num_outstanding > max_imbalance:
        return least, Route.IMBALANCE
    return preferred, Route.DIVERTED


class Router:
    """The kernel's router for one run: the scenario's rule, the request's class, and a count of every route."""

    def __init__(self, cfg: RouterConfig, batch: np.ndarray | Column) -> None:
        self.cfg = cfg
        self.batch = batch
        # (class, route) -> requests; class "batch" or "latency", route a Route's value or "least_outstanding".
        self.counts: Counter[tuple[str, str]] = Counter()
        # class -> requests that landed on a replica of the kind speculation_aware prefers for it, under either
        # rule: how far the rule moved traffic.
        self.matched: Counter[str] = Counter()

    def route(self, request: int, replicas: Sequence[R]) -> R:
        batch = bool(self.batch[request])
        if self.cfg.kind == "least_outstanding":
            replica, how = least_outstanding(replicas), "least_outstanding"
        else:
            replica, route = speculation_aware(replicas, batch, self.cfg.max_imbalance)
            how = route.value
        cls = "batch" if batch else "latency"
        self.counts[cls, how] += 1
        self.matched[cls] += replica.kv_expanded if batch else replica.draft_resident
        return replica
