"""The controller's bookkeeping, free of Ray so it can be tested with a fake clock.

It keeps the latest snapshot per replica, forgets replicas that stop reporting, queues directives
(policy changes) that each replica collects with its next telemetry push, and plans draft transfers
across replicas (``specserve.memory.cluster_plan``): at each push the pushing replica learns whether
its wanted reload or offload is granted, queued or refused.

A push costs the same whatever the cluster's size. The pushing replica's decisions depend on its node (the
node's link, its members' transfers) and its deployment (the floor of resident drafts, the order of offload
wants), never on the rest of the cluster, so each push plans only those, from views kept up to date push by
push: the members of each node, each deployment's count of resident drafts and its offload wants in planner
order, each deployment's sums of acceptance evidence for the priors, and the replicas in the order they were
last heard from, so that ageing out looks only at the oldest. The decisions are those of planning the whole
cluster at every push (``memory.plan_cluster``), which the controller did before; a test replays push
sequences through both.

Grants outlive the round that gave them: a replica reports its grant only at its next push, so until
then the controller counts it as granted itself, or two replicas pushing one after the other could
both take a node's last transfer slot. That next push ends the memory: a replica reads its snapshot
after applying the directives of its previous push, so the snapshot says whether the grant took. One
that did not (the trigger let go between the snapshot and the grant, then held again) is planned anew.
"""

from __future__ import annotations

import bisect
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from specserve.memory import ClusterMemoryParams, ReplicaMemory
from specserve.memory.cluster_plan import (
    counts_resident,
    offload_directive,
    offload_order,
    plan_node_reloads,
    wants_offload,
)
from specserve.messages import (
    AcceptancePrior,
    BatchingDirective,
    Directive,
    DraftMemorySnapshot,
    DraftState,
    MemoryDecision,
    MemoryDirective,
    PolicyDirective,
    ReplicaSnapshot,
)
from specserve.messages.telemetry import AcceptanceEstimate

# Host-to-device bandwidth assumed for a node none of whose replicas has reloaded a draft yet: PCIe 4.0 x16,
# about 25 GB/s in practice. Once one has, the node's measured reload rate replaces it (``node_bandwidths``).
DEFAULT_HOST_TO_DEVICE_BYTES_PER_S = 25e9
# Memory decisions kept for `ClusterController.memory_decisions` (the log has them all).
MAX_DECISIONS = 64
# `controller_batching: auto`: live replicas from which they push through their node's agents, and below which
# they push directly again. One call per replica costs the actor about 0.5 ms of CPU (the controller page's
# measurements), so at 256 replicas a second it takes about an eighth of a core, and the agents' 50 ms window
# starts paying for itself; the gap between the two stops a cluster at the threshold from flapping.
AUTO_BATCH_FROM_REPLICAS = 256
AUTO_UNBATCH_BELOW_REPLICAS = 128


def wants_node_batching(num_replicas: int, node_now: bool) -> bool:
    """Whether a replica under `controller_batching: auto` should push through its node's agent."""
    if node_now:
        return num_replicas >= AUTO_UNBATCH_BELOW_REPLICAS
    return num_replicas >= AUTO_BATCH_FROM_REPLICAS


@dataclass(slots=True)
class _Deployment:
    """One deployment's running view: the drafts its floor counts, its ungranted offload wants in planner order,
    and the sums of its replicas' acceptance evidence (for the priors)."""

    num_members: int = 0
    num_resident: int = 0
    offload_wants: list[tuple[float, str]] = field(default_factory=list)
    num_with_evidence: int = 0
    widths: Counter[int] = field(default_factory=Counter)
    accepted: list[float] = field(default_factory=list)
    reached: list[float] = field(default_factory=list)

    def add(self, memory: ReplicaMemory, evidence: AcceptanceEstimate | None, sign: int) -> None:
        self.num_members += sign
        self.num_resident += sign * counts_resident(memory)
        if wants_offload(memory):
            key = offload_order(memory)
            if sign > 0:
                bisect.insort(self.offload_wants, key)
            else:
                del self.offload_wants[bisect.bisect_left(self.offload_wants, key)]
        if evidence is not None:
            self._add_evidence(evidence, sign)

    def _add_evidence(self, e: AcceptanceEstimate, sign: int) -> None:
        width = len(e.reached_per_pos)
        self.num_with_evidence += sign
        self.widths[width] += sign
        if not self.widths[width]:
            del self.widths[width]
        if not self.num_with_evidence:
            # Nothing left to average: start the sums afresh rather than carry their rounding on.
            self.accepted, self.reached = [], []
            return
        grow = width - len(self.reached)
        if grow > 0:
            self.accepted += [0.0] * grow
            self.reached += [0.0] * grow
        for p in range(width):
            self.accepted[p] += sign * e.accepted_per_pos[p]
            self.reached[p] += sign * e.reached_per_pos[p]

    def prior(self) -> AcceptancePrior | None:
        """One typical replica's worth of the evidence: the average over the replicas that have any, on the
        positions they all have."""
        n = self.num_with_evidence
        width = min(self.widths, default=0)
        if not n or not width:
            return None
        return AcceptancePrior(
            tuple(a / n for a in self.accepted[:width]), tuple(r / n for r in self.reached[:width]), n
        )


@dataclass(frozen=True, slots=True)
class _Entry:
    """What the views hold for one replica: its latest snapshot, the memory view built from it (with any grant
    handed out since) and the acceptance evidence it adds to its deployment's sums."""

    snapshot: ReplicaSnapshot
    memory: ReplicaMemory
    evidence: AcceptanceEstimate | None


class ControllerState:
    def __init__(
        self,
        clock: Callable[[], float],
        stale_after_s: float = 10.0,
        memory: ClusterMemoryParams | None = None,
        node_bandwidth_bytes_per_s: dict[str, float] | None = None,
    ) -> None:
        self._clock = clock
        self._stale_after_s = stale_after_s
        self._memory = memory or ClusterMemoryParams()
        self._bandwidth = node_bandwidth_bytes_per_s or {}
        # Grants handed out that the replica has not reported back yet: replica -> the grant.
        self._grants: dict[str, MemoryDecision] = {}
        # The latest memory decisions, oldest first: (time, replica, kind, reason); counts by kind, cumulative. Kinds
        # by value: `ClusterController.memory_decisions` hands them to the CLI as plain strings.
        self.decisions: deque[tuple[float, str, str, str]] = deque(maxlen=MAX_DECISIONS)
        self.decision_counts: Counter[str] = Counter()
        self._entries: dict[str, _Entry] = {}
        # Replica -> when it last pushed, least recent first: ageing out stops at the first one still fresh.
        self._last_seen_s: OrderedDict[str, float] = OrderedDict()
        self._nodes: defaultdict[str, set[str]] = defaultdict(set)
        self._deployments: defaultdict[str, _Deployment] = defaultdict(_Deployment)
        self._pending: dict[str, list[PolicyDirective]] = {}
        # A cluster-wide policy also reaches replicas that register after it was set.
        self._cluster_policy: PolicyDirective | None = None

    def push(self, snapshot: ReplicaSnapshot) -> list[Directive]:
        """Record a replica's snapshot; return the directives waiting for it and its memory directive, if any.

        A replica new to the controller that has verified no draft yet also gets its deployment's acceptance
        prior, after its policy (which the prior seeds)."""
        now = self._clock()
        replica = snapshot.replica_id
        # Unknown to the views: a replica that fell silent is new again once it has aged out.
        is_new = replica not in self._entries
        # Fresh before the others age out: a replica is never dropped by its own push.
        self._last_seen_s[replica] = now
        self._last_seen_s.move_to_end(replica)
        self._expire(now)
        pending: list[Directive] = list(self._pending.pop(replica, []))
        if is_new and self._cluster_policy is not None and not pending:
            pending = [self._cluster_policy]
        if is_new and not any(snapshot.engine.speculation.num_reached_per_pos):
            # Before the replica's own evidence joins the sums: the prior is its peers'.
            if (prior := self._prior(snapshot.model_id)) is not None:
                pending.append(prior)
        self._grants.pop(replica, None)  # this snapshot shows whether the last grant took
        self._record(snapshot)
        if snapshot.batching_node is not None:
            live = len(self._entries)
            if (node := wants_node_batching(live, snapshot.batching_node)) != snapshot.batching_node:
                pending.append(BatchingDirective(node=node, num_replicas=live))
        return pending + self._plan_memory(replica, now)

    def _prior(self, model_id: str) -> AcceptancePrior | None:
        deployment = self._deployments.get(model_id)
        return deployment.prior() if deployment is not None else None

    # -- the views -----------------------------------------------------------------------------------------

    def _record(self, snapshot: ReplicaSnapshot) -> None:
        self._forget_views(snapshot.replica_id)
        ema = snapshot.engine.acceptance_ema
        entry = _Entry(snapshot, self._memory_of(snapshot), ema if any(ema.reached_per_pos) else None)
        self._entries[snapshot.replica_id] = entry
        self._nodes[snapshot.node_id].add(snapshot.replica_id)
        self._deployments[snapshot.model_id].add(entry.memory, entry.evidence, +1)

    def _forget_views(self, replica: str) -> None:
        entry = self._entries.pop(replica, None)
        if entry is None:
            return
        snapshot = entry.snapshot
        members = self._nodes[snapshot.node_id]
        members.discard(replica)
        if not members:
            del self._nodes[snapshot.node_id]
        deployment = self._deployments[snapshot.model_id]
        deployment.add(entry.memory, entry.evidence, -1)
        if not deployment.num_members:
            del self._deployments[snapshot.model_id]

    def _regrant(self, replica: str, grant: MemoryDecision) -> None:
        """A grant handed out changes the replica's view until its next push reports it."""
        self._grants[replica] = grant
        snapshot = self._entries[replica].snapshot
        self._record(snapshot)

    def _expire(self, now: float) -> None:
        while self._last_seen_s:
            replica, seen = next(iter(self._last_seen_s.items()))
            if now - seen <= self._stale_after_s:
                return
            self._drop(replica)

    def _drop(self, replica: str) -> None:
        self._last_seen_s.pop(replica, None)
        self._forget_views(replica)
        self._pending.pop(replica, None)
        self._grants.pop(replica, None)

    # -- memory planning -------------------------------------------------------------------------------

    def _plan_memory(self, replica: str, now: float) -> list[MemoryDirective]:
        """The pushing replica's part of the cluster's plan: its node's reloads, its deployment's offloads."""
        entry = self._entries[replica]
        mine: list[MemoryDirective] = []
        me = entry.memory
        if me.reload_wanted and not me.reload_granted:
            node = entry.snapshot.node_id
            members = [self._entries[r].memory for r in sorted(self._nodes[node])]
            bandwidth = self._node_bandwidth(node)
            mine += [d for d in plan_node_reloads(node, members, bandwidth, self._memory) if d.replica_id == replica]
        if wants_offload(me):
            deployment = self._deployments[entry.snapshot.model_id]
            rank = bisect.bisect_left(deployment.offload_wants, offload_order(me))
            mine.append(offload_directive(me, rank, deployment.num_resident, self._memory))
        for directive in mine:
            if directive.kind.grants:
                self._regrant(replica, directive.kind)
            self.decisions.append((now, replica, directive.kind.value, directive.reason))
            self.decision_counts[directive.kind.value] += 1
        return mine

    def _node_bandwidth(self, node: str) -> float:
        """Bytes per second a draft reload moves on ``node``: as configured; else as measured, the node's replicas'
        reloaded bytes over their reloads' seconds (a reload that shared the link reads slow, so the measure errs
        toward fewer concurrent reloads); else the PCIe default."""
        if node in self._bandwidth:
            return self._bandwidth[node]
        moved = seconds = 0.0
        for r in sorted(self._nodes[node]):
            memory = self._entries[r].snapshot.engine.draft_memory
            transfers = memory.transfers if memory is not None else None
            if transfers is not None and transfers.reload_s > 0 and transfers.bytes_reloaded > 0:
                moved += transfers.bytes_reloaded
                seconds += transfers.reload_s
        return moved / seconds if seconds > 0 else DEFAULT_HOST_TO_DEVICE_BYTES_PER_S

    def node_bandwidths(self) -> dict[str, float]:
        """Every live node's reload bandwidth (``_node_bandwidth``), with configured nodes not yet seen."""
        self._expire(self._clock())
        return {node: self._node_bandwidth(node) for node in sorted(self._nodes)} | self._bandwidth

    def _memory_of(self, snapshot: ReplicaSnapshot) -> ReplicaMemory:
        replica = snapshot.replica_id
        # An engine without speculation counts as a resident draft that wants nothing: it has nothing to move.
        memory = snapshot.engine.draft_memory or DraftMemorySnapshot(DraftState.RESIDENT, 0, 0)
        # A grant handed out since this snapshot was read (cleared again by the replica's next push).
        granted = self._grants.get(replica)
        return ReplicaMemory(
            replica_id=replica,
            node_id=snapshot.node_id,
            deployment=snapshot.model_id,
            state=memory.state,
            offload_wanted=memory.offload_wanted,
            offload_granted=memory.offload_granted or granted is MemoryDecision.GRANT_OFFLOAD,
            reload_wanted=memory.reload_wanted,
            reload_granted=memory.reload_granted or granted is MemoryDecision.GRANT_RELOAD,
            # Requests that would speculate again: the simulator's stand-in for the gain too.
            expected_gain=float(snapshot.engine.load.num_running),
            draft_bytes=memory.draft_bytes,
        )

    # -- the operator's side (the CLI): these may look at every replica ------------------------------------

    def unregister(self, replica: str) -> None:
        """A replica shutting down says goodbye, so status need not wait for it to go stale."""
        self._drop(replica)

    def replicas(self) -> list[ReplicaSnapshot]:
        """Live replicas, ordered by id; replicas silent for ``stale_after_s`` are dropped."""
        self._expire(self._clock())
        return [self._entries[r].snapshot for r in sorted(self._entries)]

    def num_replicas(self) -> int:
        """How many replicas are live, without listing them."""
        self._expire(self._clock())
        return len(self._entries)

    @property
    def cluster_policy(self) -> str | None:
        """The policy set for every replica, if any: what a restarted controller must remember."""
        return self._cluster_policy.policy if self._cluster_policy is not None else None

    def restore(self, cluster_policy: str | None) -> None:
        """After a restart: new and re-registering replicas get the cluster policy again."""
        self._cluster_policy = PolicyDirective(cluster_policy) if cluster_policy else None

    def set_policy(self, policy: str, replica: str | None = None) -> list[str]:
        """Queue a policy change for one replica or all; returns the replica ids it went to."""
        live = [s.replica_id for s in self.replicas()]
        directive = PolicyDirective(policy)
        if replica is not None:
            if replica not in live:
                raise ValueError(f"unknown replica {replica!r}; live replicas: {', '.join(live) or 'none'}")
            targets = [replica]
        else:
            self._cluster_policy = directive
            targets = live
        for target in targets:
            self._pending.setdefault(target, []).append(directive)
        return targets
