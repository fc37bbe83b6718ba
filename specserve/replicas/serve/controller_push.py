"""A replica's pushes to the cluster controller, which never hold up its telemetry loop.

One push at a time: a round whose push is still unanswered sends none, so a slow controller sees fewer pushes
rather than a queue that grows for good, and the replica's view there ages by a round or two, never out. A round
waits for its answer only until ``deadline`` (within the period), then goes on; an answer that comes later still
has its directives applied, before the next snapshot is read and pushed, so a replica's snapshot always shows
what its previous directives did (the controller's grants rely on that).

With ``batching == "node"`` the pushes go through the node's agent (``controller.node_agent``), which sends a
node's replicas to the controller in one call. With ``"auto"`` (the default) they go to the controller directly
until it answers, from the cluster's size, that they should go through the agent (``BatchingDirective``), and back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import ray

from specserve.messages import CONTROLLER_NAME, CONTROLLER_NAMESPACE, BatchingDirective, Directive, ReplicaSnapshot

logger = logging.getLogger("ray.serve")

# A push unanswered this long is given up and the controller looked up again (it may have been replaced).
GIVE_UP_S = 30.0
BATCHING_MODES = ("auto", "none", "node")


class ControllerPusher:
    def __init__(self, node_id: str, batching: str, apply: Callable[[Directive], Awaitable[None]]) -> None:
        if batching not in BATCHING_MODES:
            raise ValueError(f"speculation.controller_batching={batching!r}: choose one of {', '.join(BATCHING_MODES)}")
        self._node_id = node_id
        self._auto = batching == "auto"
        # Whether pushes go through the node's agent now.
        self.node = batching == "node"
        self._apply = apply
        self._target: Any = None
        self._in_flight: asyncio.Task[bool] | None = None

    def next_round_s(self, period_s: float, started_s: float) -> float:
        """Seconds to sleep before the next round: a period after this one's start, or, batched, the node's next
        phase (its replicas then land in one of the agent's windows)."""
        if self.node:
            from specserve.controller.node_agent import telemetry_phase_s

            phase = telemetry_phase_s(self._node_id, period_s)
            now = time.time()
            return (phase - now) % period_s or period_s
        return max(0.0, period_s - (time.monotonic() - started_s))

    async def round(self, snapshot: ReplicaSnapshot, deadline_s: float) -> bool:
        """Push ``snapshot`` unless a push is still out; whether an answer came by ``deadline_s`` (monotonic)."""
        if self._in_flight is None or self._in_flight.done():
            if self._auto:
                snapshot = replace(snapshot, batching_node=self.node)
            self._in_flight = asyncio.get_running_loop().create_task(self._push(snapshot))
        done, _ = await asyncio.wait({self._in_flight}, timeout=max(0.0, deadline_s - time.monotonic()))
        return bool(done) and self._in_flight.result()

    def cancel(self) -> None:
        if self._in_flight is not None:
            self._in_flight.cancel()

    async def _push(self, snapshot: ReplicaSnapshot) -> bool:
        target = self._target or self._find_target()
        if target is None:
            return False
        try:
            directives = await asyncio.wait_for(target.push.remote(snapshot), GIVE_UP_S)
        except (TimeoutError, ray.exceptions.RayActorError):
            self._target = None
            return False
        except Exception:  # the telemetry loop must go on whatever a push does
            logger.exception("specserve: push to the controller failed")
            self._target = None
            return False
        self._target = target
        if directives is None:  # the node agent had no answer from the controller
            return False
        for directive in directives:
            if isinstance(directive, BatchingDirective):
                self._switch(directive)
                continue
            try:
                await self._apply(directive)
            except Exception:
                logger.exception("specserve: controller directive %s failed", directive)
        return True

    def _switch(self, directive: BatchingDirective) -> None:
        """From the next push on, through the node's agent or directly (auto only; a fixed mode keeps its way)."""
        if not self._auto or directive.node == self.node:
            return
        self.node, self._target = directive.node, None
        logger.info(
            "specserve: controller_batching auto: %s at %d live replicas",
            "pushing through the node's agent" if self.node else "pushing to the controller directly",
            directive.num_replicas,
        )

    def _find_target(self) -> Any:
        if self.node:
            from specserve.controller.node_agent import get_or_create_node_agent

            try:
                return get_or_create_node_agent(self._node_id)
            except Exception:
                logger.exception("specserve: no node agent on %s; pushing to the controller directly", self._node_id)
        return find_controller()


def find_controller() -> Any:
    """The cluster's controller actor, or None while it has none (looked up by name)."""
    try:
        return ray.get_actor(CONTROLLER_NAME, namespace=CONTROLLER_NAMESPACE)
    except ValueError:
        return None
