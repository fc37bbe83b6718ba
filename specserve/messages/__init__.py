"""The messages that cross a process boundary between specserve's parts, and where the controller lives.

    EngineCore --EngineTelemetry--> replica      a dict through vLLM's EngineCore utility call (msgpack)
    replica    --ReplicaSnapshot--> controller   a Ray actor call, about once a second
    controller --list[Directive]--> replica      the reply to that call: PolicyDirective, AcceptancePrior (to a new
                                                 replica), MemoryDirective (the cluster planner's decision),
                                                 BatchingDirective (how to push, where batching is auto)

``telemetry.py`` holds what an engine reports (one frozen snapshot per owner), ``directives.py`` what the
controller answers. ``specserve.replicas`` and ``specserve.controller`` both import this package and never each
other, so either side's internals can change alone. It imports no ray, vllm or torch: the CLI, the controller's
bookkeeping, the pure memory planner and the unit tests use these types without loading a framework.

Every message is a frozen dataclass: a receiver cannot change what the sender meant, and one read is
one consistent picture (all fields taken between the same two engine steps).
"""

from __future__ import annotations

from specserve.messages.directives import (
    AcceptancePrior,
    BatchingDirective,
    Directive,
    MemoryDecision,
    MemoryDirective,
    PolicyDirective,
)
from specserve.messages.telemetry import (
    AcceptanceEstimate,
    Counts,
    DraftMemorySnapshot,
    DraftState,
    DraftTransfers,
    EngineTelemetry,
    LoadSnapshot,
    PolicySnapshot,
    ReplicaSnapshot,
    SpeculationCounters,
)

# The controller is a named, detached Ray actor: replicas find it by this name in this namespace
# instead of being handed a reference, so a controller restart or a late start needs no redeploy.
CONTROLLER_NAME = "specserve-controller"
CONTROLLER_NAMESPACE = "specserve"
# Ray's resource of the head node alone, asked in a token amount: the controller and the HTTP ingress run there,
# so a worker node that fails takes its engines with it and nothing that routes to or watches the others.
ON_HEAD_NODE = {"node:__internal_head__": 0.001}

__all__ = [
    "CONTROLLER_NAME",
    "CONTROLLER_NAMESPACE",
    "ON_HEAD_NODE",
    "AcceptanceEstimate",
    "AcceptancePrior",
    "BatchingDirective",
    "Counts",
    "Directive",
    "DraftMemorySnapshot",
    "DraftTransfers",
    "DraftState",
    "EngineTelemetry",
    "LoadSnapshot",
    "MemoryDecision",
    "MemoryDirective",
    "PolicyDirective",
    "PolicySnapshot",
    "ReplicaSnapshot",
    "SpeculationCounters",
]
