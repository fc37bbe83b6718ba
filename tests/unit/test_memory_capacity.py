"""KV capacity accounting and the contraction's migration plan (Nightjar §6, §6.4)."""

from __future__ import annotations

import pytest

from specserve.memory import KvCapacity, ResidencyParams, plan_migration

MIB, KIB = 1024**2, 1024


def test_worked_example_nightjar_7b_draft_buys_a_quarter_more_kv() -> None:
    # DeepSeek-R1-Distill-Qwen-7B: 28 layers x 4 KV heads x 128 x 2 (K, V) x 2 bytes x 16 tokens = 896 KiB a block;
    # the 0.5B draft is 942.511 MiB in BF16 (Nightjar App. E); the fork's pool is 4,112 blocks.
    capacity = KvCapacity(num_base_blocks=4112, draft_bytes=int(942.511 * MIB), bytes_per_block=896 * KIB)
    assert capacity.num_draft_blocks == 1078
    assert capacity.num_expanded_blocks == 4112 + 1078
    assert capacity.is_extra(4112) and not capacity.is_extra(4111)


def test_a_partial_block_of_draft_bytes_counts_as_a_whole_block() -> None:
    assert KvCapacity(10, draft_bytes=3 * 100 + 1, bytes_per_block=100).num_draft_blocks == 4
    assert KvCapacity(10, draft_bytes=3 * 100, bytes_per_block=100).num_draft_blocks == 3


@pytest.mark.parametrize("field", ["num_base_blocks", "draft_bytes", "bytes_per_block"])
def test_capacity_rejects_non_positive_sizes_naming_the_field(field: str) -> None:
    values = {"num_base_blocks": 10, "draft_bytes": 100, "bytes_per_block": 10, field: 0}
    with pytest.raises(ValueError, match=field):
        KvCapacity(**values)


@pytest.mark.parametrize(
    "field,value",
    [
        ("low_free_ratio", 0.0),
        ("window_steps", 0),
        ("reload_buffer_ratio", 1.0),
        ("retry_max_s", 1.0),
        ("min_resident_s", -1.0),
        ("min_resident_s", float("nan")),
    ],
)
def test_residency_params_reject_bad_values_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        ResidencyParams(**{field: value})


def test_migration_moves_every_live_extra_block_to_a_distinct_free_preserved_block() -> None:
    plan = plan_migration(100, live_extra=[130, 101, 117], free_base=[5, 60, 7, 99])
    assert sorted(m.source for m in plan.moves) == [101, 117, 130]
    destinations = [m.destination for m in plan.moves]
    assert len(set(destinations)) == 3 and all(d < 100 for d in destinations)
    assert plan.num_moved == 3


def test_migration_refuses_when_too_few_preserved_blocks_are_free() -> None:
    with pytest.raises(ValueError, match="drain"):
        plan_migration(100, live_extra=[101, 102], free_base=[3])


def test_migration_refuses_blocks_on_the_wrong_side_of_the_boundary() -> None:
    with pytest.raises(ValueError, match="live_extra"):
        plan_migration(100, live_extra=[99], free_base=[3])
    with pytest.raises(ValueError, match="free_base"):
        plan_migration(100, live_extra=[101], free_base=[100])


def test_an_empty_extra_region_needs_no_moves() -> None:
    assert plan_migration(100, live_extra=[], free_base=[]).moves == ()


def test_lending_the_drafts_kv_share_adds_its_pages_of_every_baseline_block() -> None:
    # 100-byte blocks of which the draft's layers hold 20: the expanded pool's blocks are 80 bytes, and the offload
    # lends the 300 weight bytes plus 20 bytes of each of the 10 baseline blocks: 500 bytes, 7 blocks (6.25 rounded up).
    capacity = KvCapacity(10, draft_bytes=300, bytes_per_block=100, draft_kv_bytes_per_block=20)
    assert capacity.target_bytes_per_block == 80
    assert capacity.lent_bytes == 500
    assert capacity.num_draft_blocks == 7
    # The expanded buffer (target-only blocks) is never smaller than the baseline buffer plus the weights.
    assert capacity.num_expanded_blocks * 80 >= 10 * 100 + 300
    assert capacity.num_draft_blocks > KvCapacity(10, draft_bytes=300, bytes_per_block=100).num_draft_blocks


@pytest.mark.parametrize("share", [-1, 100, 120])
def test_capacity_rejects_a_draft_kv_share_outside_the_block(share: int) -> None:
    with pytest.raises(ValueError, match="draft_kv_bytes_per_block"):
        KvCapacity(10, draft_bytes=300, bytes_per_block=100, draft_kv_bytes_per_block=share)
