"""EngineCore side of a KV pool that grows and shrinks at run time: the scheduler's block pool (vLLM 0.32.0).

The worker's KV tensors are resized by ``draft_memory.resize_kv``; this module changes what the scheduler
hands out to match, between two steps. Growing appends free blocks. Shrinking is drain-aware: blocks at or
above the new size are *withheld* as they become free (taken off the free queue, their prefix-cache hashes
dropped, so neither a new allocation nor a prefix hit can reach them), and the pool is cut only once none is
held by a request. Blocks still held can instead be *migrated*: each live block of the cut region is swapped,
in every request's block list, for a free block below it, its prefix-cache hashes going along; the worker copies
the pages and rewrites its block tables in the same pause between two steps (``draft_memory.migrate_blocks``).

Private vLLM interfaces touched (paths under ``vllm/``, vLLM 0.32.0):

- ``v1/core/block_pool.py`` ``BlockPool``: ``.blocks``, ``.num_gpu_blocks``, ``.free_block_queue``,
  ``._maybe_evict_cached_block`` (729), ``.get_num_free_blocks``.
- ``v1/core/kv_cache_utils.py`` ``KVCacheBlock(block_id, pool=...)`` (176: ``ref_cnt``, ``prev_free_block``,
  which is set exactly while the block is in the free queue); ``FreeKVCacheBlockQueue.append_n`` / ``.remove``.
- ``v1/core/block_pool.py`` ``BlockPool.move_block_hashes`` (648); ``kv_cache_manager.coordinator.
  single_type_managers[*].req_to_blocks`` (request id -> its ``KVCacheBlock`` list).
- ``Scheduler.kv_cache_config.num_blocks`` and ``.cache_config.num_gpu_blocks``, kept equal to the pool's size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def pool_of(scheduler: Any) -> Any:
    return scheduler.kv_cache_manager.block_pool


def _set_size(scheduler: Any, num_blocks: int) -> None:
    pool = pool_of(scheduler)
    pool.num_gpu_blocks = num_blocks
    scheduler.kv_cache_config.num_blocks = num_blocks
    scheduler.cache_config.num_gpu_blocks = num_blocks


def grow(scheduler: Any, num_blocks: int) -> None:
    """Append free blocks up to ``num_blocks``; the worker's tensors must already hold them."""
    from vllm.v1.core.kv_cache_utils import KVCacheBlock

    pool = pool_of(scheduler)
    if num_blocks < len(pool.blocks):
        raise ValueError(f"cannot grow the pool of {len(pool.blocks)} blocks to {num_blocks}")
    new = [KVCacheBlock(i, pool=pool) for i in range(len(pool.blocks), num_blocks)]
    pool.blocks.extend(new)
    pool.free_block_queue.append_n(new)
    _set_size(scheduler, num_blocks)


def withhold_from(scheduler: Any, first: int) -> int:
    """Take every free block with id >= ``first`` out of circulation. Returns how many such blocks requests
    still hold (0: the pool can be cut to ``first``)."""
    pool = pool_of(scheduler)
    held = 0
    for block in pool.blocks[first:]:
        if block.ref_cnt > 0:
            held += 1
        elif block.prev_free_block is not None:  # free and queued: a later allocation could take it
            pool._maybe_evict_cached_block(block)
            pool.free_block_queue.remove(block)
    return held


def release_withheld(scheduler: Any) -> None:
    """Put withheld blocks back into circulation (a contraction given up)."""
    pool = pool_of(scheduler)
    idle = [block for block in pool.blocks[1:] if block.ref_cnt == 0 and block.prev_free_block is None]
    pool.free_block_queue.append_n(idle)


def shrink(scheduler: Any, num_blocks: int) -> None:
    """Cut the pool to ``num_blocks`` once ``withhold_from(num_blocks)`` reports nothing held."""
    pool = pool_of(scheduler)
    if withhold_from(scheduler, num_blocks):
        raise RuntimeError(f"blocks at or above {num_blocks} are still in use")
    del pool.blocks[num_blocks:]
    _set_size(scheduler, num_blocks)


def live_blocks_from(scheduler: Any, first: int) -> list[int]:
    """Ids >= ``first`` that requests hold."""
    return [block.block_id for block in pool_of(scheduler).blocks[first:] if block.ref_cnt > 0]


def free_blocks_below(scheduler: Any, first: int, count: int) -> list[int]:
    """Up to ``count`` free ids below ``first``, blocks without prefix-cache hashes first (moving into a cached
    block would evict a prefix another request could still hit)."""
    pool = pool_of(scheduler)
    free = [block for block in pool.blocks[1:first] if block.ref_cnt == 0 and block.prev_free_block is not None]
    free.sort(key=lambda block: (block.block_hash is not None, block.block_id))
    return [block.block_id for block in free[:count]]


def migrate(scheduler: Any, moves: Sequence[tuple[int, int]]) -> None:
    """Swap each live block ``source`` for the free block ``destination`` in every request that holds it; the
    source ends free and out of circulation (withheld). All moves are checked before any is made, so a
    refused migration changes nothing. The worker must copy the same pages before the next step."""
    pool = pool_of(scheduler)
    places: dict[int, list[tuple[list[Any], int]]] = {}
    for manager in scheduler.kv_cache_manager.coordinator.single_type_managers:
        for blocks in manager.req_to_blocks.values():
            for index, block in enumerate(blocks):
                places.setdefault(block.block_id, []).append((blocks, index))
    for source, destination in moves:
        src, dst = pool.blocks[source], pool.blocks[destination]
        if dst.ref_cnt or dst.prev_free_block is None:
            raise RuntimeError(f"cannot move block {source} to {destination}: {destination} is not free")
        # A reference no request list accounts for (a copy in flight, a connector's pin) cannot be moved.
        if src.ref_cnt == 0 or len(places.get(source, ())) != src.ref_cnt:
            raise RuntimeError(f"cannot move block {source}: {src.ref_cnt} references, not all from requests")
    for source, destination in moves:
        src, dst = pool.blocks[source], pool.blocks[destination]
        pool._maybe_evict_cached_block(dst)
        pool.free_block_queue.remove(dst)
        pool.move_block_hashes(src, dst)
        for blocks, index in places[source]:
            blocks[index] = dst
        dst.ref_cnt, src.ref_cnt = src.ref_cnt, 0
