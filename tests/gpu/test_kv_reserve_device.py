"""The KV reserve on a GPU: CUDA virtual memory behind the layout the CPU engine grows its pool in.

Torch and the CUDA driver only, no vLLM: the layout is ``plain_layout``'s stand-in for vLLM's, and the pages
are read and written through the reserve's raw buffer at its regions. Free memory is the driver's count.
Skipped without a CUDA device; run on one with ``python3 -m pytest --noconftest -p no:cacheprovider tests/gpu``.
"""

from __future__ import annotations

import pytest
import torch

from specserve.replicas.draft_memory.kv_reserve import KvReserve, PlainLayout, plain_layout

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

MIB = 1 << 20
TARGET = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
DRAFT = ["draft_model.model.layers.0.self_attn.attn"]
# 1 MiB blocks, two to a 2 MiB driver chunk: an odd capacity ends mid-chunk.
PAGE = MIB
BASELINE, CAPACITY = 64, 255


def up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def layout() -> PlainLayout:
    return plain_layout(TARGET + DRAFT, PAGE, BASELINE)


def free_bytes() -> int:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def block(reserve: KvReserve, name_index: int, draft: bool, block_id: int) -> torch.Tensor:
    region = reserve.regions(draft)[name_index]
    start = region.start + block_id * region.page
    return reserve.raw[start : start + region.page]


@pytest.fixture
def reserve():
    r = KvReserve(layout(), CAPACITY, BASELINE, device="cuda")
    yield r
    r.pages.close()


def test_only_what_the_pool_addresses_is_backed_and_the_rest_goes_back_to_the_driver(reserve):
    unit = reserve.unit
    assert unit % (2 * MIB) == 0 and reserve.raw.device.type == "cuda"
    baseline = PAGE * BASELINE  # whole chunks
    before = free_bytes()
    newly = reserve.commit(BASELINE, lend_draft_kv=False)
    assert abs(before - free_bytes() - newly) <= unit, "the driver's free memory did not fall by what was mapped"
    assert reserve.resident_bytes() == baseline * (len(TARGET) + len(DRAFT))

    # Lend the draft's region (its bytes go back), then grow the target's layers into the reserve.
    before = free_bytes()
    assert reserve.trim(BASELINE, lend_draft_kv=True) == baseline * len(DRAFT)
    assert free_bytes() - before == baseline * len(DRAFT)
    reserve.commit(CAPACITY, lend_draft_kv=True)
    assert reserve.resident_bytes() == up(PAGE * CAPACITY, unit) * len(TARGET)

    # Contract: the target's tails go back to the driver, the baseline stays.
    before = free_bytes()
    back = reserve.trim(BASELINE, lend_draft_kv=True)
    assert back == (up(PAGE * CAPACITY, unit) - baseline) * len(TARGET)
    assert free_bytes() - before == back
    assert reserve.resident_bytes() == baseline * len(TARGET)


def test_growing_keeps_every_block_in_place_and_new_blocks_read_as_zeros(reserve):
    reserve.commit(BASELINE, lend_draft_kv=False)
    address = reserve.raw.data_ptr()
    block(reserve, 0, True, 0).fill_(5)
    for i in range(len(TARGET)):
        for b in range(BASELINE):
            block(reserve, i, False, b).fill_(10 * i + b % 7 + 1)
    reserve.trim(BASELINE, lend_draft_kv=True)
    reserve.commit(CAPACITY, lend_draft_kv=True)
    assert reserve.raw.data_ptr() == address
    for i in range(len(TARGET)):
        for b in (0, BASELINE // 2, BASELINE - 1):
            assert torch.all(block(reserve, i, False, b) == 10 * i + b % 7 + 1), "a kept block changed"
        assert torch.all(block(reserve, i, False, CAPACITY - 1) == 0), "a newly mapped block is not zeroed"
        block(reserve, i, False, CAPACITY - 1).fill_(99)
    reserve.trim(BASELINE, lend_draft_kv=False)
    reserve.commit(BASELINE, lend_draft_kv=False)
    assert torch.all(block(reserve, 0, True, 0) == 0), "the draft's region laid out again reads as zeros"
    reserve.commit(CAPACITY, lend_draft_kv=True)
    assert torch.all(block(reserve, 1, False, CAPACITY - 1) == 0), "a block given back and remapped kept old bytes"


def test_a_graph_captured_before_the_grow_reads_the_blocks_mapped_after_it(reserve):
    reserve.commit(BASELINE, lend_draft_kv=True)
    region = reserve.regions(draft=False)[1]
    blocks = reserve.raw[region.start : region.start + region.capacity * region.page].view(torch.float32)
    blocks = blocks.view(region.capacity, -1)
    blocks[:BASELINE] = torch.arange(BASELINE, device="cuda", dtype=torch.float32)[:, None]
    index = torch.arange(8, device="cuda")
    out = torch.empty(8, blocks.shape[1], device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.index_select(blocks, 0, index, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.index_select(blocks, 0, index, out=out)

    reserve.commit(CAPACITY, lend_draft_kv=True)
    wanted = torch.arange(CAPACITY - 8, CAPACITY, device="cuda")
    blocks[wanted] = wanted.to(torch.float32)[:, None]
    index.copy_(wanted)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out[:, 0], wanted.to(torch.float32)) and torch.all(out == out[:, :1])
