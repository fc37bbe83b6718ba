"""One engine telemetry read, built in code, for the tests of what consumes it (controller, status table)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specserve.messages import (
    AcceptanceEstimate,
    DraftMemorySnapshot,
    DraftState,
    DraftTransfers,
    EngineTelemetry,
    LoadSnapshot,
    PolicySnapshot,
    SpeculationCounters,
)
from specserve.messages.telemetry import CollapseSnapshot

# An engine with max_k 4 that ran 3 steps at k = 2, 9 tokens out, on a pool of 10 KV blocks, its draft resident.
SAMPLE = EngineTelemetry(
    policy=PolicySnapshot(spec="adaptive", k=2, max_k=4, info={}),
    load=LoadSnapshot(num_running=1, num_waiting=0, num_kv_blocks_total=10, num_kv_blocks_free=8),
    speculation=SpeculationCounters(
        num_steps=3,
        num_emitted_tokens=9,
        num_steps_by_k=(0, 0, 3, 0, 0),
        num_drafted_per_pos=(3, 3, 0, 0),
        num_reached_per_pos=(3, 2, 0, 0),
        num_accepted_per_pos=(2, 1, 0, 0),
    ),
    acceptance_ema=AcceptanceEstimate(per_pos=(0.6, 0.5, 0.5, 0.5)),
    step_durations_s=(0.01,),
    draft_memory=DraftMemorySnapshot(state=DraftState.RESIDENT, baseline_blocks=0, draft_bytes=0),
    collapse=CollapseSnapshot(),
)


def engine_telemetry(**changes: Any) -> EngineTelemetry:
    """``SAMPLE`` with the given changes (see ``changed``)."""
    return changed(SAMPLE, **changes)


def changed(engine: EngineTelemetry, **changes: Any) -> EngineTelemetry:
    """``engine`` with a part's fields changed by name (``num_running=4`` changes ``load``, ``reload_s=2.0`` the draft
    memory's transfers: no two parts share a field name), or a whole part replaced (``draft_memory=None``)."""
    parts: dict[str, Any] = {}
    for name, value in changes.items():
        if name in EngineTelemetry.__dataclass_fields__:
            parts[name] = value
            continue
        if name in DraftTransfers.__dataclass_fields__:
            memory = parts.get("draft_memory", engine.draft_memory)
            parts["draft_memory"] = replace(memory, transfers=replace(memory.transfers, **{name: value}))
            continue
        (part,) = [p for p in _PARTS if name in type(getattr(SAMPLE, p)).__dataclass_fields__]
        parts[part] = replace(parts.get(part, getattr(engine, part)), **{name: value})
    return replace(engine, **parts)


_PARTS = ("policy", "load", "speculation", "acceptance_ema", "draft_memory", "collapse")
