"""The cluster controller: one named, detached Ray actor per cluster."""

from __future__ import annotations

import time

import ray

from specserve.controller.state import ControllerState
from specserve.messages import CONTROLLER_NAME, CONTROLLER_NAMESPACE, PolicyDirective, ReplicaSnapshot


@ray.remote(num_cpus=0, max_restarts=-1)
class ClusterController:
    """Aggregates replica snapshots and hands out directives.

    Replicas call ``push`` from their telemetry loop; the CLI calls ``replicas`` and ``set_policy``.
    If the actor restarts, its state is empty until replicas push again (about a second).
    """

    def __init__(self, stale_after_s: float = 10.0) -> None:
        self._state = ControllerState(clock=time.monotonic, stale_after_s=stale_after_s)

    def push(self, snapshot: ReplicaSnapshot) -> list[PolicyDirective]:
        return self._state.push(snapshot)

    def unregister(self, replica: str) -> None:
        self._state.unregister(replica)

    def replicas(self) -> list[ReplicaSnapshot]:
        return self._state.replicas()

    def set_policy(self, policy: str, replica: str | None = None) -> list[str]:
        return self._state.set_policy(policy, replica)


def get_or_create_controller() -> ray.actor.ActorHandle:
    # ray.remote turned the class into an actor class with .options; the checker sees the plain class.
    return ClusterController.options(  # type: ignore[attr-defined]
        name=CONTROLLER_NAME, namespace=CONTROLLER_NAMESPACE, lifetime="detached", get_if_exists=True
    ).remote()


def get_controller() -> ray.actor.ActorHandle | None:
    """The running controller, or None when this cluster has none (yet)."""
    try:
        return ray.get_actor(CONTROLLER_NAME, namespace=CONTROLLER_NAMESPACE)
    except ValueError:
        return None
