"""The cluster controller: one named, detached Ray actor per cluster.

What must outlive the actor (the cluster-wide policy) is kept in Ray's internal key-value store, which lives
in the GCS: a restarted controller (``max_restarts=-1``) reads it back, and replicas, which keep serving on
their own rules while it is gone, get it again at their next push.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import ray
from ray.experimental import internal_kv
from ray.util import metrics

from specserve import metrics_catalog
from specserve.controller.state import ControllerState
from specserve.memory import ClusterMemoryParams
from specserve.messages import (
    CONTROLLER_NAME,
    CONTROLLER_NAMESPACE,
    ON_HEAD_NODE,
    AcceptancePrior,
    Directive,
    MemoryDirective,
    ReplicaSnapshot,
)

logger = logging.getLogger(__name__)
# Internal KV keys (namespace CONTROLLER_NAMESPACE) of what survives a controller restart.
CLUSTER_POLICY_KEY = b"cluster_policy"


@dataclass(frozen=True, slots=True)
class ControllerUsage:
    # CPU seconds the actor's process has used.
    cpu_s: float
    # Calls to push and push_many, and the snapshots they carried.
    num_calls: int
    num_pushes: int
    num_replicas: int


@ray.remote(num_cpus=0, max_restarts=-1)
class ClusterController:
    """Aggregates replica snapshots and hands out directives.

    Replicas call ``push`` from their telemetry loop; the CLI calls ``replicas`` and ``set_policy``.
    If the actor restarts, its state is empty until replicas push again (about a second).
    """

    def __init__(self, stale_after_s: float = 10.0, memory: ClusterMemoryParams | None = None) -> None:
        # A restarted actor gets the same arguments again (Ray keeps them): the floor and the transfer cap survive.
        self._state = ControllerState(clock=time.monotonic, stale_after_s=stale_after_s, memory=memory)
        self._num_pushes = self._num_calls = 0
        saved = internal_kv._internal_kv_get(CLUSTER_POLICY_KEY, namespace=CONTROLLER_NAMESPACE)
        if saved:
            self._state.restore(saved.decode())
            logger.info("specserve controller: restored cluster policy %s", saved.decode())
        decisions = metrics_catalog.CONTROLLER_MEMORY_DECISIONS
        self._decisions = metrics.Counter(decisions.name, description=decisions.description, tag_keys=decisions.labels)
        priors = metrics_catalog.CONTROLLER_ACCEPTANCE_PRIORS
        self._priors = metrics.Counter(priors.name, description=priors.description)

    def push(self, snapshot: ReplicaSnapshot) -> list[Directive]:
        self._num_calls += 1
        return self._answer(snapshot)

    def _answer(self, snapshot: ReplicaSnapshot) -> list[Directive]:
        self._num_pushes += 1
        directives = self._state.push(snapshot)
        for d in directives:
            if isinstance(d, MemoryDirective):
                self._decisions.inc(1, tags={metrics_catalog.KIND: d.kind.value})
                logger.info("specserve controller: %s %s (%s)", d.kind.value, d.replica_id, d.reason)
            elif isinstance(d, AcceptancePrior):
                self._priors.inc(1)
                logger.info(
                    "specserve controller: acceptance prior for new replica %s from %d replica(s) of %s: %s",
                    snapshot.replica_id,
                    d.num_replicas,
                    snapshot.model_id,
                    [
                        round(a / r, 3) if r else None
                        for a, r in zip(d.accepted_per_pos, d.reached_per_pos, strict=True)
                    ],
                )
        return directives

    def push_many(self, snapshots: list[ReplicaSnapshot]) -> list[list[Directive]]:
        """Several replicas' pushes in one call (a node's replicas, batched): each one's directives, in order. One
        call instead of many saves Ray's cost per call, which at thousands of replicas is most of the actor's."""
        self._num_calls += 1
        return [self._answer(s) for s in snapshots]

    def usage(self) -> ControllerUsage:
        """What the scale benchmark reads, and `status` could."""
        return ControllerUsage(time.process_time(), self._num_calls, self._num_pushes, self._state.num_replicas())

    def memory_decisions(self) -> list[tuple[float, str, str, str]]:
        """The latest memory decisions, oldest first: (monotonic time, replica, kind, reason)."""
        return list(self._state.decisions)

    def unregister(self, replica: str) -> None:
        self._state.unregister(replica)

    def replicas(self) -> list[ReplicaSnapshot]:
        return self._state.replicas()

    def set_policy(self, policy: str, replica: str | None = None) -> list[str]:
        targets = self._state.set_policy(policy, replica)
        if replica is None:
            internal_kv._internal_kv_put(CLUSTER_POLICY_KEY, policy.encode(), namespace=CONTROLLER_NAMESPACE)
        return targets


def get_or_create_controller(memory: ClusterMemoryParams | None = None) -> ray.actor.ActorHandle:
    """The cluster's controller; ``memory`` applies only when this call creates it (a joined cluster keeps the
    parameters its controller was started with)."""
    # ray.remote turned the class into an actor class with .options; the checker sees the plain class.
    return ClusterController.options(  # type: ignore[attr-defined]
        name=CONTROLLER_NAME,
        namespace=CONTROLLER_NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        # Beside Serve's own controller (Ray Train places its state actor the same way).
        resources=ON_HEAD_NODE,
        # Never in the caller's placement group: a replica that starts it runs in its engine's, which Ray Serve LLM
        # has capture its children.
        scheduling_strategy="DEFAULT",
    ).remote(memory=memory)


def get_controller() -> ray.actor.ActorHandle | None:
    """The running controller, or None when this cluster has none (yet)."""
    try:
        return ray.get_actor(CONTROLLER_NAME, namespace=CONTROLLER_NAMESPACE)
    except ValueError:
        return None
