"""One agent per node that sends its node's replicas' pushes to the controller in one call.

At thousands of replicas the controller's cost is Ray's cost per call, not its planning (``specserve bench
controller``: on the project's 2-core machine about 0.6 ms of the actor's CPU a call against 10 us of planning),
so one actor cannot take one call per replica per second there. With ``controller_batching: node`` (or ``auto``
once the cluster is large, ``controller.state.wants_node_batching``) a replica pushes to its node's agent
instead; the agent holds the pushes that arrive within ``window_s`` of the first and sends them as one
``push_many``, then answers each replica with its own directives. Replicas on one node push at the same phase of
the second (``telemetry_phase_s``), so a node's pushes land in one window; nodes spread over the second by their
id. The controller's decisions are the same as for one push at a time, in the order the
batch lists them (by replica id).
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from specserve.messages import CONTROLLER_NAME, CONTROLLER_NAMESPACE, Directive, ReplicaSnapshot

logger = logging.getLogger(__name__)
AGENT_NAME_PREFIX = "specserve-node-agent-"
# Long enough for a node's replicas, which push at one phase, to land in one batch; short beside the second
# between telemetry rounds.
BATCH_WINDOW_S = 0.05


def telemetry_phase_s(node_id: str, period_s: float) -> float:
    """Where in each period a node's replicas push: the same for all of a node's, spread over nodes by id."""
    return (zlib.crc32(node_id.encode()) % 1000) / 1000 * period_s


@ray.remote(num_cpus=0, max_restarts=-1)
class NodeAgent:
    """Batches one node's pushes. Answers None to each push of a batch the controller did not answer (it is gone or
    restarting): the replica then counts the round unanswered, as it would have pushing directly."""

    def __init__(self, window_s: float = BATCH_WINDOW_S) -> None:
        self._window_s = window_s
        self._batch: list[tuple[ReplicaSnapshot, asyncio.Future]] = []
        self._flush: asyncio.Task | None = None
        self._controller: Any = None

    async def push(self, snapshot: ReplicaSnapshot) -> list[Directive] | None:
        answer: asyncio.Future = asyncio.get_running_loop().create_future()
        self._batch.append((snapshot, answer))
        if self._flush is None:
            self._flush = asyncio.create_task(self._send_after_window())
        return await answer

    async def _send_after_window(self) -> None:
        await asyncio.sleep(self._window_s)
        # By replica id: pushes race to an async actor, and a batch should decide the same whichever came first.
        batch = sorted(self._batch, key=lambda pushed: pushed[0].replica_id)
        self._batch, self._flush = [], None
        results: list[list[Directive]] | None = None
        try:
            self._controller = self._controller or ray.get_actor(CONTROLLER_NAME, namespace=CONTROLLER_NAMESPACE)
            results = await self._controller.push_many.remote([snapshot for snapshot, _ in batch])
        except (ValueError, ray.exceptions.RayActorError):  # no controller (yet), or it died: look it up again
            self._controller = None
        except Exception:
            logger.exception("specserve node agent: a batch of %d pushes failed", len(batch))
            self._controller = None
        for i, (_, answer) in enumerate(batch):
            if not answer.done():  # the replica may have given up waiting
                answer.set_result(results[i] if results is not None else None)


def get_or_create_node_agent(node_id: str) -> ray.actor.ActorHandle:
    """The agent of ``node_id`` (a Ray node id), started on that node by its first replica to ask."""
    return NodeAgent.options(  # type: ignore[attr-defined]
        name=AGENT_NAME_PREFIX + node_id,
        namespace=CONTROLLER_NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote()
