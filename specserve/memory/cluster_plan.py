"""The cluster's memory planner: which replicas may reload their draft now, and which may offload it.

Reloads share the host-to-device link of their node: N concurrent copies of one draft each run at 1/N of the
bandwidth, so each takes N times as long (Nightjar App. E, Table 16: 0.92 GiB at 23 GiB/s takes 40 ms alone,
320 ms eight at a time). A replica whose reload is queued keeps its expanded KV pool until its turn, while one
that starts contracting has given the pool back and has no draft yet, so fewer transfers in flight means less
time in that in-between state. The planner grants at most ``transfer_slots`` reloads per node, the rest queued by
expected gain (highest first), and refuses an offload that would leave a deployment with fewer resident drafts
than its floor. Every directive carries its reason, for logs and the metric that exports it.

Pure: the simulator calls it whenever a want changes, and the Ray controller on each telemetry round.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specserve.messages import DraftState, MemoryDecision, MemoryDirective


@dataclass(frozen=True, slots=True)
class ClusterMemoryParams:
    # A reload at its share of the node's link should finish within this many seconds; it sets the number of
    # concurrent transfers per node (``transfer_slots``).
    max_reload_s: float = 0.1
    # A fixed number of concurrent reloads per node instead of the bandwidth rule.
    max_concurrent_transfers: int | None = None
    # Drafts that stay resident per deployment: an offload that would go below it is refused.
    min_resident_per_deployment: int = 0

    def __post_init__(self) -> None:
        checks = {
            "max_reload_s": self.max_reload_s > 0,
            "max_concurrent_transfers": self.max_concurrent_transfers is None or self.max_concurrent_transfers >= 1,
            "min_resident_per_deployment": self.min_resident_per_deployment >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)} is out of range")


@dataclass(frozen=True, slots=True)
class ReplicaMemory:
    """One replica's memory state as the planner sees it (from the replica's ResidencyMachine)."""

    replica_id: str
    node_id: str
    deployment: str
    state: DraftState
    offload_wanted: bool
    offload_granted: bool
    reload_wanted: bool
    reload_granted: bool
    # Tokens/s the replica expects to gain by speculating again; orders the reload queue.
    expected_gain: float
    draft_bytes: int


def transfer_slots(bandwidth_bytes_per_s: float, draft_bytes: int, params: ClusterMemoryParams) -> int:
    """Concurrent reloads one node allows: as many as each finish within ``max_reload_s`` at their share, at least
    one. Worked example: a 0.92 GiB draft over 23 GiB/s takes 40 ms alone, so 0.1 s allows 2."""
    if params.max_concurrent_transfers is not None:
        return params.max_concurrent_transfers
    return max(1, math.floor(params.max_reload_s * bandwidth_bytes_per_s / draft_bytes))


def _in_flight(r: ReplicaMemory) -> bool:
    """Holding a reload slot: granted and not yet resident (an offload moves nothing over the link: Nightjar keeps
    the host copy, §6.2)."""
    return r.state in (DraftState.CONTRACTING, DraftState.RELOADING) or (
        r.state is DraftState.OFFLOADED and r.reload_granted
    )


def plan_cluster(
    replicas: Sequence[ReplicaMemory],
    node_bandwidth_bytes_per_s: Mapping[str, float],
    params: ClusterMemoryParams,
) -> list[MemoryDirective]:
    """Directives for every replica that wants an offload or a reload it has not been granted yet."""
    return [*_plan_reloads(replicas, node_bandwidth_bytes_per_s, params), *_plan_offloads(replicas, params)]


def _plan_reloads(
    replicas: Sequence[ReplicaMemory], bandwidth: Mapping[str, float], params: ClusterMemoryParams
) -> list[MemoryDirective]:
    by_node: dict[str, list[ReplicaMemory]] = defaultdict(list)
    for r in replicas:
        by_node[r.node_id].append(r)
    out: list[MemoryDirective] = []
    for node, members in sorted(by_node.items()):
        if node not in bandwidth and any(r.reload_wanted and not r.reload_granted for r in members):
            raise ValueError(f"no host-to-device bandwidth for node {node!r}")
        out += plan_node_reloads(node, members, bandwidth.get(node, 0.0), params)
    return out


def plan_node_reloads(
    node: str, members: Sequence[ReplicaMemory], bandwidth_bytes_per_s: float, params: ClusterMemoryParams
) -> list[MemoryDirective]:
    """One node's reload directives: a node's link is its own, so its plan needs only its members (the controller
    plans the pushing replica's node alone, whatever the cluster's size)."""
    waiting = sorted(
        (r for r in members if r.reload_wanted and not r.reload_granted),
        key=lambda r: (-r.expected_gain, r.replica_id),
    )
    if not waiting:
        return []
    slots = transfer_slots(bandwidth_bytes_per_s, max(r.draft_bytes for r in members), params)
    busy = sum(map(_in_flight, members))
    link = f"{bandwidth_bytes_per_s / 1e9:.3g} GB/s"
    out: list[MemoryDirective] = []
    for position, r in enumerate(waiting):
        if busy < slots:
            busy += 1
            why = f"node {node} ({link}): {busy}/{slots} transfers with this one; gain rank {position + 1}"
            out.append(MemoryDirective(r.replica_id, MemoryDecision.GRANT_RELOAD, why))
        else:
            queued = position + 1 - slots
            why = f"node {node} ({link}): {busy}/{slots} transfers in flight; queued {queued} by expected gain"
            out.append(MemoryDirective(r.replica_id, MemoryDecision.QUEUE_RELOAD, why))
    return out


def counts_resident(r: ReplicaMemory) -> bool:
    """A draft the deployment's floor counts: resident and not granted an offload."""
    return r.state is DraftState.RESIDENT and not r.offload_granted


def wants_offload(r: ReplicaMemory) -> bool:
    return r.offload_wanted and not r.offload_granted


def offload_order(r: ReplicaMemory) -> tuple[float, str]:
    """The replica that expects least from speculating gives its draft up first."""
    return (r.expected_gain, r.replica_id)


def offload_directive(r: ReplicaMemory, rank: int, num_resident: int, params: ClusterMemoryParams) -> MemoryDirective:
    """The offload directive of the wanting replica at ``rank`` (0: first in ``offload_order``) of a deployment with
    ``num_resident`` counted drafts before any of its wants is granted: the ones ahead of it are granted while the
    floor allows, so it is granted if fewer than ``num_resident - floor`` are ahead of it."""
    floor = params.min_resident_per_deployment
    granted_ahead = min(rank, max(0, num_resident - floor))
    left = num_resident - granted_ahead
    if left - 1 >= floor:
        return MemoryDirective(
            r.replica_id, MemoryDecision.GRANT_OFFLOAD, f"{left - 1} stay resident in {r.deployment}"
        )
    why = f"{r.deployment} keeps at least {floor} resident drafts; {left} are"
    return MemoryDirective(r.replica_id, MemoryDecision.REFUSE_OFFLOAD, why)


def _plan_offloads(replicas: Sequence[ReplicaMemory], params: ClusterMemoryParams) -> list[MemoryDirective]:
    resident: dict[str, int] = defaultdict(int)
    for r in replicas:
        if counts_resident(r):
            resident[r.deployment] += 1
    ahead: dict[str, int] = defaultdict(int)
    out: list[MemoryDirective] = []
    for r in sorted(filter(wants_offload, replicas), key=offload_order):
        out.append(offload_directive(r, ahead[r.deployment], resident[r.deployment], params))
        ahead[r.deployment] += 1
    return out
