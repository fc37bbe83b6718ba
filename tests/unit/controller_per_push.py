"""The controller's planning before issue 62, kept as the oracle of the incremental one: at every push it re-plans
every live replica (``plan_cluster``, O(N log N) a push), averages priors over all peers, and ages replicas out by a
scan. Only what the change replaced is here; the policy queue and a replica's memory view are inherited unchanged.
Only tests import it."""

from __future__ import annotations

from collections.abc import Callable

from specserve.controller.state import DEFAULT_HOST_TO_DEVICE_BYTES_PER_S, ControllerState
from specserve.memory import ClusterMemoryParams, plan_cluster
from specserve.messages import AcceptancePrior, Directive, MemoryDirective, ReplicaSnapshot


class PerPushControllerState(ControllerState):
    def __init__(
        self,
        clock: Callable[[], float],
        stale_after_s: float = 10.0,
        memory: ClusterMemoryParams | None = None,
        node_bandwidth_bytes_per_s: dict[str, float] | None = None,
    ) -> None:
        super().__init__(clock, stale_after_s, memory, node_bandwidth_bytes_per_s)
        self._snapshots: dict[str, ReplicaSnapshot] = {}
        self._seen_s: dict[str, float] = {}

    def push(self, snapshot: ReplicaSnapshot) -> list[Directive]:
        replica = snapshot.replica_id
        is_new = replica not in self._snapshots
        self._grants.pop(replica, None)  # this snapshot shows whether the last grant took
        self._snapshots[replica] = snapshot
        self._seen_s[replica] = self._clock()
        pending: list[Directive] = list(self._pending.pop(replica, []))
        if is_new and self._cluster_policy is not None and not pending:
            pending = [self._cluster_policy]
        if is_new and not any(snapshot.engine.speculation.num_reached_per_pos) and (prior := self._prior_for(snapshot)):
            pending.append(prior)
        return pending + self._plan_whole_cluster(replica)

    def _prior_for(self, snapshot: ReplicaSnapshot) -> AcceptancePrior | None:
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

    def _plan_whole_cluster(self, replica: str) -> list[MemoryDirective]:
        live = self.replicas()
        memories = [self._memory_of(s) for s in live]
        mine = [d for d in plan_cluster(memories, self._bandwidths(live), self._memory) if d.replica_id == replica]
        for directive in mine:
            if directive.kind.grants:
                self._grants[replica] = directive.kind
            self.decisions.append((self._clock(), replica, directive.kind.value, directive.reason))
            self.decision_counts[directive.kind.value] += 1
        return mine

    def node_bandwidths(self) -> dict[str, float]:
        return self._bandwidths(self.replicas())

    def _bandwidths(self, live: list[ReplicaSnapshot]) -> dict[str, float]:
        moved: dict[str, list[float]] = {}
        for s in live:
            totals = moved.setdefault(s.node_id, [0.0, 0.0])
            transfers = s.engine.draft_memory.transfers if s.engine.draft_memory is not None else None
            if transfers is not None and transfers.reload_s > 0 and transfers.bytes_reloaded > 0:
                totals[0] += transfers.bytes_reloaded
                totals[1] += transfers.reload_s
        measured = {node: b / t if t > 0 else DEFAULT_HOST_TO_DEVICE_BYTES_PER_S for node, (b, t) in moved.items()}
        return measured | self._bandwidth

    def unregister(self, replica: str) -> None:
        self._snapshots.pop(replica, None)
        self._seen_s.pop(replica, None)
        self._pending.pop(replica, None)
        self._grants.pop(replica, None)

    def replicas(self) -> list[ReplicaSnapshot]:
        now = self._clock()
        for replica, seen in list(self._seen_s.items()):
            if now - seen > self._stale_after_s:
                del self._seen_s[replica], self._snapshots[replica]
                self._pending.pop(replica, None)
                self._grants.pop(replica, None)
        return [self._snapshots[r] for r in sorted(self._snapshots)]
