"""The telemetry's counters are declared once, in their snapshot, and counted by their owner as attributes
(``messages.Counts``): the owner counts exactly the snapshot's fields and refuses any other name. And
`status --json` keeps the keys it printed when the telemetry was one flat record."""

from __future__ import annotations

from dataclasses import fields

import pytest
from telemetry_samples import SAMPLE, engine_telemetry

from specserve.messages import DraftTransfers, SpeculationCounters
from specserve.replicas.core.telemetry import StepCounters
from specserve.replicas.draft_memory.elastic_draft import MemoryCounters
from specserve.speculation import StepRecord

# `specserve status --json`'s engine keys before the telemetry was split into parts (tests/serve and users'
# scripts read them).
FLAT_KEYS_BEFORE = {
    "policy", "k", "max_k", "num_running", "num_waiting", "num_kv_blocks_total", "num_kv_blocks_free", "draft_state",
    "num_steps", "num_emitted_tokens", "num_steps_by_k", "num_drafted_per_pos", "num_reached_per_pos",
    "num_accepted_per_pos", "acceptance_ema_per_pos", "step_durations_s", "policy_info", "num_prefill_tokens_announced",
    "num_drafts_capped", "num_steps_draft_skipped", "num_drafts_cut_for_lag", "num_drafts_cut_by_confidence",
    "num_requests_caught_up", "num_catch_up_tokens", "policy_s", "policy_cpu_s", "policy_errors",
    "num_kv_blocks_baseline", "draft_bytes", "num_offloads", "num_reloads", "num_reload_failures", "offload_s",
    "reload_s", "bytes_offloaded", "bytes_reloaded", "blocks_migrated", "migrate_s", "offload_wanted",
    "offload_granted", "reload_wanted", "reload_granted", "memory_reason", "memory_coordinated",
    "acceptance_ema_accepted_per_pos", "acceptance_ema_reached_per_pos", "failed_checks",
}  # fmt: skip


def test_the_owners_count_exactly_their_snapshots_fields():
    steps = StepCounters(max_k=2).values()
    assert set(steps) - {"max_k", "recent_steps"} == {f.name for f in fields(SpeculationCounters)}
    memory = MemoryCounters().values()
    assert {name for name in memory if not name.startswith("last_")} - {"history"} == {
        f.name for f in fields(DraftTransfers)
    }


def test_a_counter_the_snapshot_does_not_declare_is_refused_where_it_is_counted():
    counters = StepCounters(max_k=2)
    with pytest.raises(AttributeError, match="num_drafts_caped.*SpeculationCounters"):
        counters.num_drafts_caped = 1
    with pytest.raises(AttributeError):
        counters.num_drafts_caped += 1


def test_a_snapshot_is_frozen_in_time():
    counters = StepCounters(max_k=2)
    record = StepRecord(
        now_s=0.0, k=1, duration_s=0.01, num_running=1, num_context_tokens=8, num_batched_tokens=2,
        num_draft_passes=1, num_emitted_tokens=2, num_drafted_per_request=(1,), num_accepted_per_request=(1,),
    )  # fmt: skip
    counters.add(record)
    counters.num_drafts_capped += 1
    first = counters.snapshot()
    counters.add(record)
    assert (first.num_steps, first.num_steps_by_k, first.num_drafted_per_pos) == (1, (0, 1, 0), (1, 0))
    assert first.num_drafts_capped == 1 and counters.snapshot().num_steps == 2


def test_status_json_keeps_its_keys():
    assert set(SAMPLE.flat()) >= FLAT_KEYS_BEFORE
    flat = engine_telemetry(spec="fixed:k=1", reason="draft resident").flat()
    assert (flat["policy"], flat["draft_state"], flat["memory_reason"]) == ("fixed:k=1", "resident", "draft resident")
    assert engine_telemetry(draft_memory=None).flat()["draft_state"] == "none"
