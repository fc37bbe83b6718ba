"""One engine telemetry read, built in code, for the tests of what consumes it (controller, status table)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specserve.messages import EngineTelemetry

# An engine with max_k 4 that ran 3 steps at k = 2, 9 tokens out, on a pool of 10 KV blocks.
SAMPLE = EngineTelemetry(
    policy="adaptive",
    k=2,
    max_k=4,
    num_running=1,
    num_waiting=0,
    num_kv_blocks_total=10,
    num_kv_blocks_free=8,
    draft_state="resident",
    num_steps=3,
    num_emitted_tokens=9,
    num_steps_by_k=(0, 0, 3, 0, 0),
    num_drafted_per_pos=(3, 3, 0, 0),
    num_reached_per_pos=(3, 2, 0, 0),
    num_accepted_per_pos=(2, 1, 0, 0),
    acceptance_ema_per_pos=(0.6, 0.5, 0.5, 0.5),
    step_durations_s=(0.01,),
    policy_info={},
    num_prefill_tokens_announced=0,
    num_drafts_capped=0,
)


def engine_telemetry(**changes: Any) -> EngineTelemetry:
    """``SAMPLE`` with the given fields changed."""
    return replace(SAMPLE, **changes)
