"""Draft memory elasticity, pure: residency state machine, KV capacity accounting, migration plans, and the
cluster planner that coordinates reloads across replicas (Nightjar §6, App. E). No ray, vllm or torch here: the
simulator and the engine drive the same code."""

from specserve.memory.capacity import KvCapacity
from specserve.memory.cluster_plan import (
    ClusterMemoryParams,
    ReplicaMemory,
    plan_cluster,
    transfer_slots,
)
from specserve.memory.migration import BlockMove, MigrationPlan, plan_migration
from specserve.memory.params import ResidencyParams
from specserve.memory.residency import (
    Action,
    BlockLayout,
    DraftState,
    ExpandPool,
    MemoryStep,
    ResidencyMachine,
    StartContraction,
    StartOffload,
    StartReload,
)

__all__ = [
    "Action",
    "BlockLayout",
    "BlockMove",
    "ClusterMemoryParams",
    "DraftState",
    "ExpandPool",
    "KvCapacity",
    "MemoryStep",
    "MigrationPlan",
    "ReplicaMemory",
    "ResidencyMachine",
    "ResidencyParams",
    "StartContraction",
    "StartOffload",
    "StartReload",
    "plan_cluster",
    "plan_migration",
    "transfer_slots",
]
