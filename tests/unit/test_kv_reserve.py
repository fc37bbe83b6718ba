"""A KV cache reserved for the largest pool grows without a copy and gives back the pages a smaller pool drops.

Real vLLM layout objects and views over a real anonymous mapping; the resident bytes are the operating system's.
"""

from __future__ import annotations

import mmap

import pytest
import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from vllm.v1.kv_cache_layout import KVCacheLayout

from specserve.replicas.draft_memory.kv_reserve import KvReserve

TARGET = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
DRAFT = ["draft_model.model.layers.0.self_attn.attn"]
# 16 tokens x 2 heads x 64 floats x (K, V): 16 KiB a page, four operating-system pages.
SPEC = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float32)
BASELINE, CAPACITY = 8, 20


def vllm_layout(num_blocks: int = BASELINE, shared: bool = True) -> KVCacheConfig:
    """What vLLM makes: one buffer, each layer a region of ``num_blocks`` pages; target and draft in one tensor
    (``shared``, as when they share an attention group) or one each."""
    page = SPEC.page_size_bytes
    stride = page * num_blocks
    size = stride * (len(TARGET) + len(DRAFT))
    if shared:
        tensors = [KVCacheTensor(size=size, layers=TARGET + DRAFT, layer_stride=stride, block_stride=page)]
    else:
        tensors = [
            KVCacheTensor(size=size, layers=TARGET, layer_stride=stride, block_stride=page),
            KVCacheTensor(size=size, layers=DRAFT, layer_stride=stride, block_stride=page, offset=stride * 2),
        ]
    groups = [KVCacheGroupSpec(TARGET, SPEC), KVCacheGroupSpec(DRAFT, SPEC)]
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=tensors, kv_cache_groups=groups)


def views(reserve: KvReserve, num_blocks: int, lend: bool) -> dict[str, torch.Tensor]:
    return reserve.views(reserve.config(num_blocks, lend), KVCacheLayout.LBHNC, None)


@pytest.mark.parametrize("shared", [True, False])
def test_growing_keeps_every_page_where_it_was_and_copies_nothing(shared):
    reserve = KvReserve(vllm_layout(shared=shared), CAPACITY, BASELINE)
    small = views(reserve, BASELINE, lend=False)
    assert set(small) == set(TARGET + DRAFT) and small[TARGET[0]].shape[0] == BASELINE
    for index, cache in enumerate(small.values()):
        cache.fill_(index + 1.0)
    grown = views(reserve, CAPACITY, lend=True)
    assert set(grown) == set(TARGET), "the lent draft's layers keep no view"
    for name in TARGET:
        assert grown[name].shape[0] == CAPACITY
        assert grown[name].data_ptr() == small[name].data_ptr(), "a grown layer moved"
        assert torch.equal(grown[name][:BASELINE], small[name])
    # The layers' regions do not overlap at the grown size.
    grown[TARGET[0]][BASELINE:].fill_(-1.0)
    assert torch.all(grown[TARGET[1]][:BASELINE] == 2.0) and torch.all(grown[TARGET[1]][BASELINE:] == 0.0)
    assert torch.all(small[DRAFT[0]] == 3.0)


def test_a_pool_past_the_reserve_or_a_resident_draft_past_its_region_is_refused():
    reserve = KvReserve(vllm_layout(), CAPACITY, BASELINE)
    with pytest.raises(ValueError, match="past the reserve"):
        reserve.config(CAPACITY + 1, lend_draft_kv=True)
    with pytest.raises(ValueError, match="past the reserve"):
        reserve.config(BASELINE + 1, lend_draft_kv=False)
    with pytest.raises(ValueError, match="must cover"):
        KvReserve(vllm_layout(), BASELINE - 1, BASELINE)


def test_a_layout_that_is_not_layer_outermost_is_refused():
    layout = vllm_layout()
    layout.kv_cache_tensors[0].layer_stride = SPEC.page_size_bytes  # block-outermost: a block holds every layer
    with pytest.raises(RuntimeError, match="layer-outermost"):
        KvReserve(layout, CAPACITY, BASELINE)


def test_the_reserve_costs_no_memory_until_written_and_a_trim_gives_the_cut_pages_back():
    reserve = KvReserve(vllm_layout(), CAPACITY, BASELINE)
    assert reserve.size >= SPEC.page_size_bytes * (CAPACITY * len(TARGET) + BASELINE * len(DRAFT))
    assert reserve.resident_bytes() == 0
    grown = views(reserve, CAPACITY, lend=True)
    for cache in grown.values():
        cache.fill_(1.0)
    written = reserve.committed_bytes(CAPACITY, lend_draft_kv=True)
    assert written == SPEC.page_size_bytes * CAPACITY * len(TARGET)
    assert reserve.resident_bytes() == written

    reserve.trim(BASELINE, lend_draft_kv=False)
    assert reserve.resident_bytes() == SPEC.page_size_bytes * BASELINE * len(TARGET)
    small = views(reserve, BASELINE, lend=False)
    assert torch.all(small[TARGET[0]] == 1.0), "a trim touched a block the pool kept"
    assert torch.all(small[DRAFT[0]] == 0.0)
    regrown = views(reserve, CAPACITY, lend=True)
    assert torch.all(regrown[TARGET[1]][BASELINE:] == 0.0), "a page given back reads as zeros"


def test_lending_gives_the_draft_regions_back_whole():
    reserve = KvReserve(vllm_layout(shared=False), CAPACITY, BASELINE)
    for cache in views(reserve, BASELINE, lend=False).values():
        cache.fill_(1.0)
    before = reserve.resident_bytes()
    advised = reserve.trim(CAPACITY, lend_draft_kv=True)
    draft_region = SPEC.page_size_bytes * BASELINE * len(DRAFT)
    assert before - reserve.resident_bytes() == draft_region
    assert advised >= draft_region and advised % mmap.PAGESIZE == 0


def test_a_reserve_on_a_device_without_a_backing_or_without_cuda_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="on meta is not built"):
        KvReserve(vllm_layout(), CAPACITY, BASELINE, device="meta")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs a CUDA device"):
            KvReserve(vllm_layout(), CAPACITY, BASELINE, device="cuda")
