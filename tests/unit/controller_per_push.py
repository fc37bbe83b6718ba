"""Today's controller bookkeeping before issue 62, kept verbatim as the oracle of the incremental one: it re-plans every
live replica at every push (O(N log N) a push). Only tests import it."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable

from specserve.memory import ClusterMemoryParams, ReplicaMemory, plan_cluster
from specserve.messages import (
    AcceptancePrior,
    Directive,
    DraftMemorySnapshot,
    DraftState,
    MemoryDecision,
    MemoryDirective,
    PolicyDirective,
    ReplicaSnapshot,
)

# Host-to-device bandwidth assumed for a node none of whose replicas has reloaded a draft yet: PCIe 4.0 x16,
# about 25 GB/s in practice. Once one has, the node's measured reload rate replaces it (``node_bandwidths``).
DEFAULT_HOST_TO_DEVICE_BYTES_PER_S = 25e9
# Memory decisions kept for `ClusterController.memory_decisions` (the log has them all).
MAX_DECISIONS = 64


class PerPushControllerState:
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
        self._snapshots: dict[str, ReplicaSnapshot] = {}
        self._last_seen_s: dict[str, float] = {}
        self._pending: dict[str, list[PolicyDirective]] = {}
        # A cluster-wide policy also reaches replicas that register after it was set.
        self._cluster_policy: PolicyDirective | None = None

    def push(self, snapshot: ReplicaSnapshot) -> list[Directive]:
        """Record a replica's snapshot; return the directives waiting for it and its memory directive, if any.

        A replica new to the controller that has verified no draft yet also gets its deployment's acceptance
        prior, after its policy (which the prior seeds)."""
        replica = snapshot.replica_id
        is_new = replica not in self._snapshots
        self._grants.pop(replica, None)  # this snapshot shows whether the last grant took
        self._snapshots[replica] = snapshot
        self._last_seen_s[replica] = self._clock()
        pending: list[Directive] = list(self._pending.pop(replica, []))
        if is_new and self._cluster_policy is not None and not pending:
            pending = [self._cluster_policy]
        if is_new and not any(snapshot.engine.speculation.num_reached_per_pos) and (prior := self._prior_for(snapshot)):
            pending.append(prior)
        return pending + self._plan_memory(replica)

    def _prior_for(self, snapshot: ReplicaSnapshot) -> AcceptancePrior | None:
        """The deployment's other live replicas' acceptance evidence, averaged: one typical replica's worth."""
        peers = [
            s.engine.acceptance_ema
            for s in self.replicas()
            if s.model_id == snapshot.model_id
            and s.replica_id != snapshot.replica_id
            and any(s.engine.acceptance_ema.reached_per_pos)
        ]
        width = min((len(e.reached_per_pos) for e in peers), default=0)
        if not width:
            return None
        accepted = [sum(e.accepted_per_pos[p] for e in peers) / len(peers) for p in range(width)]
        reached = [sum(e.reached_per_pos[p] for e in peers) / len(peers) for p in range(width)]
        return AcceptancePrior(tuple(accepted), tuple(reached), len(peers))

    def _plan_memory(self, replica: str) -> list[MemoryDirective]:
        """Plan every live replica's transfers; hand out the pushing replica's part."""
        live = self.replicas()
        memories = [self._memory_of(s) for s in live]
        mine = [d for d in plan_cluster(memories, self.node_bandwidths(live), self._memory) if d.replica_id == replica]
        for directive in mine:
            if directive.kind.grants:
                self._grants[replica] = directive.kind
            self.decisions.append((self._clock(), replica, directive.kind.value, directive.reason))
            self.decision_counts[directive.kind.value] += 1
        return mine

    def node_bandwidths(self, live: list[ReplicaSnapshot] | None = None) -> dict[str, float]:
        """Bytes per second a draft reload moves, per node: as configured; else as measured, the node's replicas'
        reloaded bytes over their reloads' seconds (a reload that shared the link reads slow, so the measure errs
        toward fewer concurrent reloads); else the PCIe default."""
        moved: dict[str, list[float]] = {}
        for s in live if live is not None else self.replicas():
            totals = moved.setdefault(s.node_id, [0.0, 0.0])
            transfers = s.engine.draft_memory.transfers if s.engine.draft_memory is not None else None
            if transfers is not None and transfers.reload_s > 0 and transfers.bytes_reloaded > 0:
                totals[0] += transfers.bytes_reloaded
                totals[1] += transfers.reload_s
        measured = {node: b / t if t > 0 else DEFAULT_HOST_TO_DEVICE_BYTES_PER_S for node, (b, t) in moved.items()}
        return measured | self._bandwidth

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

    def unregister(self, replica: str) -> None:
        """A replica shutting down says goodbye, so status need not wait for it to go stale."""
        self._snapshots.pop(replica, None)
        self._last_seen_s.pop(replica, None)
        self._pending.pop(replica, None)
        self._grants.pop(replica, None)

    def replicas(self) -> list[ReplicaSnapshot]:
        """Live replicas, ordered by id; replicas silent for ``stale_after_s`` are dropped."""
        now = self._clock()
        for replica, seen in list(self._last_seen_s.items()):
            if now - seen > self._stale_after_s:
                del self._last_seen_s[replica], self._snapshots[replica]
                self._pending.pop(replica, None)
                self._grants.pop(replica, None)
        return [self._snapshots[r] for r in sorted(self._snapshots)]

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
