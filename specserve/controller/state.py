"""The controller's bookkeeping, free of Ray so it can be tested with a fake clock.

It keeps the latest snapshot per replica, forgets replicas that stop reporting, and queues
directives (policy changes) that each replica collects with its next telemetry push.
"""

from __future__ import annotations

from collections.abc import Callable

from specserve.messages import PolicyDirective, ReplicaSnapshot


class ControllerState:
    def __init__(self, clock: Callable[[], float], stale_after_s: float = 10.0) -> None:
        self._clock = clock
        self._stale_after_s = stale_after_s
        self._snapshots: dict[str, ReplicaSnapshot] = {}
        self._last_seen_s: dict[str, float] = {}
        self._pending: dict[str, list[PolicyDirective]] = {}
        # A cluster-wide policy also reaches replicas that register after it was set.
        self._cluster_policy: PolicyDirective | None = None

    def push(self, snapshot: ReplicaSnapshot) -> list[PolicyDirective]:
        """Record a replica's snapshot; return the directives waiting for it."""
        replica = snapshot.replica_id
        is_new = replica not in self._snapshots
        self._snapshots[replica] = snapshot
        self._last_seen_s[replica] = self._clock()
        pending = self._pending.pop(replica, [])
        if is_new and self._cluster_policy is not None and not pending:
            pending = [self._cluster_policy]
        return pending

    def unregister(self, replica: str) -> None:
        """A replica shutting down says goodbye, so status need not wait for it to go stale."""
        self._snapshots.pop(replica, None)
        self._last_seen_s.pop(replica, None)
        self._pending.pop(replica, None)

    def replicas(self) -> list[ReplicaSnapshot]:
        """Live replicas, ordered by id; replicas silent for ``stale_after_s`` are dropped."""
        now = self._clock()
        for replica, seen in list(self._last_seen_s.items()):
            if now - seen > self._stale_after_s:
                del self._last_seen_s[replica], self._snapshots[replica]
                self._pending.pop(replica, None)
        return [self._snapshots[r] for r in sorted(self._snapshots)]

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
