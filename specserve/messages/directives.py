"""What the controller answers a replica's push with: a list of ``Directive``s, each applied in order."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True, slots=True)
class PolicyDirective:
    """Controller -> replica: run this policy from the replica's next engine step."""

    # A policy spec NAME[:key=value,...], already validated by the CLI against the engine's max_k.
    policy: str


@dataclass(frozen=True, slots=True)
class AcceptancePrior:
    """Controller -> new replica: its deployment's acceptance evidence, to start from instead of a cold prior.

    Decayed accepted and reached counts per draft position, averaged over the deployment's replicas that have
    verified drafts: one typical replica's recent evidence, so the new replica's own steps outweigh it as soon
    as they would outweigh a peer's history (one estimator half-life)."""

    accepted_per_pos: tuple[float, ...]
    reached_per_pos: tuple[float, ...]
    # Replicas the evidence was averaged over: for the log and the decision's reason.
    num_replicas: int


class MemoryDecision(Enum):
    """The cluster planner's answer to a replica's wanted draft transfer (``memory/cluster_plan.py``). Its value is
    the ``kind`` label of the controller's memory-decisions metric and the word the engine's utility call takes."""

    GRANT_RELOAD = "grant_reload"
    # Every transfer slot of the replica's node is taken: it keeps its expanded pool until its turn.
    QUEUE_RELOAD = "queue_reload"
    GRANT_OFFLOAD = "grant_offload"
    # The deployment would go below its floor of resident drafts.
    REFUSE_OFFLOAD = "refuse_offload"

    @property
    def grants(self) -> bool:
        """Whether the replica may start the transfer: the controller holds a granted slot until the replica's next
        push reports it."""
        return self in (MemoryDecision.GRANT_RELOAD, MemoryDecision.GRANT_OFFLOAD)


@dataclass(frozen=True, slots=True)
class MemoryDirective:
    """Controller -> replica: the cluster planner's decision on the draft transfer the replica wants."""

    # The replica it is for: the planner plans every replica at once, the controller hands each its own.
    replica_id: str
    kind: MemoryDecision
    # Why, with the numbers behind it (node, slots, floor): for the replica's and the controller's logs.
    reason: str


@dataclass(frozen=True, slots=True)
class BatchingDirective:
    """Controller -> a replica with ``controller_batching: auto``: push through the node's agent from now on
    (``node``), or to the controller directly again; sent only where the replica's push says it does otherwise.
    The replica's pusher carries it out; the replica itself never sees it."""

    node: bool
    # Live replicas the controller counted when it decided: for the replica's log.
    num_replicas: int


#: Everything a controller's reply to a push may hold; a replica dispatches on the type, exhaustively.
Directive = PolicyDirective | AcceptancePrior | MemoryDirective | BatchingDirective
