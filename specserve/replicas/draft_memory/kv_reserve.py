"""A KV cache that grows and shrinks without copying: address space reserved for the largest pool (vLLM 0.32.0).

vLLM lays its KV cache out in one buffer, every layer a region of ``num_blocks`` pages (layout LBHNC), and
allocates it with ``torch.zeros``, which writes every page. Growing that buffer means a new one and a copy of
every live page: a pause of 0.05-0.2 s on a CPU engine, and the old and the new buffer at once, which a full
machine may not have. Here the buffer is one anonymous memory mapping laid out for the *largest* pool instead:
each target layer's region spans ``capacity`` pages, the draft's layers theirs. The operating system backs a page
only once it is written (vLLM zeroes every block it hands out), so the reserve costs address space, not memory.

- **Grow:** bind wider views over the same regions. Nothing is copied or allocated.
- **Shrink:** bind narrower views and give the regions' tails back to the operating system
  (``madvise(MADV_DONTNEED)``); a page given back reads as zeros when it is next written.
- **Lend the draft's pages** (the draft is away): the draft's regions are given back whole and its layers bind
  an empty cache; laid out again, they read as zeros (a rebuilt draft catches its KV up anyway).

On a GPU the same layout stands on CUDA virtual memory (``cuda_vmm``): address space reserved once, physical
chunks mapped before a wider pool binds its views (``commit``; a GPU backs nothing on first write) and unmapped
by the trim. Regions then align to the driver's chunk (2 MiB) instead of the operating system's page. The device
backing is verified with torch alone on an H100 and an H200 (``tests/gpu``); no vLLM engine on a GPU uses it yet.

Private vLLM interfaces touched (paths under ``vllm/``, vLLM 0.32.0): ``v1/kv_cache_interface.py``
``KVCacheTensor`` (``size``, ``layers``, ``layer_stride``, ``block_stride``, ``offset``) and
``create_kv_cache_views`` (377), ``UniformTypeKVCacheSpecs``, ``KVCacheSpec.has_layer_views``; the loop of
``v1/worker/utils.py`` ``allocate_kv_cache`` (564), which is followed here for a buffer that is not zeroed.
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Iterable
from copy import deepcopy
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

DRAFT_PREFIX = "draft_model."
# Linux's MAP_NORESERVE (Python's mmap module names it only from 3.13): no swap is set aside for pages never
# written, so a reserve larger than free memory can still be mapped.
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)


def _is_draft(part: Any) -> bool:
    """Whether a tensor part holds the draft's layers (a part holds the target's or the draft's, never both)."""
    return bool(part.layers[0].startswith(DRAFT_PREFIX))


def _up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


@dataclass(frozen=True, slots=True)
class Region:
    """One layer's pages: ``[start, start + capacity * page)`` of the buffer, ``page`` bytes a block; ``unit`` is
    the backing's page (what it backs or gives back at once)."""

    start: int
    page: int
    capacity: int
    unit: int = mmap.PAGESIZE

    def head(self, num_blocks: int) -> tuple[int, int]:
        """The bytes of the first ``num_blocks`` blocks."""
        return self.start, self.start + num_blocks * self.page

    def tail(self, num_blocks: int) -> tuple[int, int]:
        """The whole backing pages past ``num_blocks`` blocks (a page shared with a kept block stays), up to the
        region's end, which is aligned to the backing's page (the last block may end mid-page)."""
        return _up(self.start + num_blocks * self.page, self.unit), _up(
            self.start + self.capacity * self.page, self.unit
        )


class HostPages:
    """Anonymous memory the operating system backs page by page on first write."""

    def __init__(self, size: int) -> None:
        self.unit = mmap.PAGESIZE
        self._map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE)
        # Shares the mapping's pages and keeps the mapping alive as long as a view of it lives.
        self.raw = torch.frombuffer(self._map, dtype=torch.int8)

    def commit(self, ranges: Iterable[tuple[int, int]]) -> int:
        return 0  # a page is backed when it is first written

    def release(self, ranges: Iterable[tuple[int, int]]) -> int:
        advised = 0
        for start, end in ranges:
            start, end = _up(start, self.unit), end - end % self.unit
            if end > start:
                self._map.madvise(mmap.MADV_DONTNEED, start, end - start)
                advised += end - start
        return advised

    def resident_bytes(self) -> int:
        """``mincore``: per page of this range alone (the kernel may merge the mapping with a neighbour, so its
        ``/proc/self/smaps`` entry can cover more)."""
        vector = np.zeros(self.raw.numel() // self.unit, dtype=np.uint8)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
        if libc.mincore(self.raw.data_ptr(), self.raw.numel(), vector.ctypes.data) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed on the KV reserve")
        return int(np.count_nonzero(vector & 1)) * self.unit


class DevicePages:
    """CUDA virtual memory: a chunk is backed only once ``commit`` maps it, and ``release`` unmaps it."""

    def __init__(self, size: int, device: torch.device) -> None:
        from specserve.replicas.draft_memory.cuda_vmm import Driver, VmmBuffer

        self._buffer = VmmBuffer(Driver(device.index or 0), size)
        self.unit = self._buffer.chunk
        self._buffer.map(0, 1)  # torch locates a tensor by its first byte (the first target layer's first block)
        self.raw = self._buffer.tensor().view(torch.int8)

    def commit(self, ranges: Iterable[tuple[int, int]]) -> int:
        return sum(self._buffer.map(start, end) for start, end in ranges if end > start)

    def release(self, ranges: Iterable[tuple[int, int]]) -> int:
        return sum(self._buffer.unmap(start, end) for start, end in ranges if end > start)

    def resident_bytes(self) -> int:
        return self._buffer.mapped_bytes

    def close(self) -> None:
        """Unmap everything and free the address space; the buffer must not be used after."""
        self._buffer.close()


@dataclass
class PlainTensor:
    """The fields of vLLM's ``KVCacheTensor`` that the reserve reads."""

    size: int
    layers: list[str]
    layer_stride: int
    block_stride: int
    offset: int = 0


@dataclass
class PlainLayout:
    """The fields of vLLM's ``KVCacheConfig`` that the reserve reads."""

    num_blocks: int
    kv_cache_tensors: list[PlainTensor]


def plain_layout(layers: list[str], page: int, num_blocks: int) -> PlainLayout:
    """vLLM's layer-outermost layout of ``num_blocks`` blocks of ``page`` bytes per layer, without vLLM: a reserve's
    template where no engine made one (on a GPU with torch alone: tests/gpu, bench/gpu_cycle.py). Layers whose
    names start with ``draft_model.`` are the draft's."""
    stride = page * num_blocks
    return PlainLayout(num_blocks, [PlainTensor(stride * len(layers), list(layers), stride, page)])


def unit_of(device: torch.device) -> int:
    """The backing's page on ``device``: the operating system's, or the CUDA driver's chunk."""
    if device.type == "cpu":
        return mmap.PAGESIZE
    if device.type != "cuda":
        raise ValueError(f"a KV reserve on {device.type} is not built (CPU and CUDA are)")
    from specserve.replicas.draft_memory.cuda_vmm import Driver

    return Driver(device.index or 0).granularity()


class KvReserve:
    """The backing buffer, laid out for ``capacity`` target blocks and ``draft_capacity`` draft blocks.

    ``template`` is vLLM's own layout (``KVCacheConfig``, layer-outermost); each of its tensors is split into a
    target part and a draft part, each with a region per layer at a page-aligned offset.
    """

    def __init__(self, template: Any, capacity: int, draft_capacity: int, device: torch.device | str = "cpu") -> None:
        device = torch.device(device)
        if capacity < template.num_blocks or draft_capacity > capacity:
            raise ValueError(f"capacity {capacity} must cover the {template.num_blocks} blocks and {draft_capacity}")
        self.capacity = capacity
        self.draft_capacity = draft_capacity
        self.unit = unit_of(device)
        parts, offset = [], 0
        for tensor in template.kv_cache_tensors:
            if tensor.layer_stride != tensor.block_stride * template.num_blocks:
                raise RuntimeError("the KV cache is not laid out layer-outermost (LBHNC); it cannot grow in place")
            for draft in (False, True):
                layers = [name for name in tensor.layers if name.startswith(DRAFT_PREFIX) == draft]
                if not layers:
                    continue
                stride = _up(tensor.block_stride * (draft_capacity if draft else capacity), self.unit)
                parts.append(replace(tensor, layers=layers, layer_stride=stride, offset=offset))
                offset += stride * len(layers)
        self.size = max(offset, self.unit)
        self.tensors = [replace(part, size=self.size) for part in parts]
        self.template = template
        self.pages = HostPages(self.size) if device.type == "cpu" else DevicePages(self.size, device)
        self.raw = self.pages.raw

    def regions(self, draft: bool) -> list[Region]:
        return [
            Region(part.offset + index * part.layer_stride, part.block_stride, self._capacity_of(part), self.unit)
            for part in self.tensors
            if _is_draft(part) == draft
            for index in range(len(part.layers))
        ]

    def _capacity_of(self, part: Any) -> int:
        return self.draft_capacity if _is_draft(part) else self.capacity

    def config(self, num_blocks: int, lend_draft_kv: bool) -> Any:
        """vLLM's layout for a pool of ``num_blocks`` over this buffer; without the draft's tensors when lent."""
        if num_blocks > self.capacity or (not lend_draft_kv and num_blocks > self.draft_capacity):
            reserve = f"{self.capacity} blocks, the draft's {self.draft_capacity}"
            raise ValueError(f"num_blocks={num_blocks} is past the reserve ({reserve})")
        config = deepcopy(self.template)
        config.num_blocks = num_blocks
        config.kv_cache_tensors = [deepcopy(part) for part in self.tensors if not (lend_draft_kv and _is_draft(part))]
        return config

    def views(self, config: Any, layout: Any, kernel_block_sizes: list[int] | None) -> dict[str, torch.Tensor]:
        """One view per layer, as ``allocate_kv_cache`` makes them, over this buffer instead of a zeroed one."""
        from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs, create_kv_cache_views

        caches: dict[str, torch.Tensor] = {}
        for tensor in config.kv_cache_tensors:
            group_id, group = next(
                (index, group)
                for index, group in enumerate(config.kv_cache_groups)
                if tensor.layers[0] in group.layer_names
            )
            spec = group.kv_cache_spec
            if isinstance(spec, UniformTypeKVCacheSpecs):
                spec = spec.kv_cache_specs[tensor.layers[0]]
            if not spec.has_layer_views:
                raise RuntimeError(f"layer {tensor.layers[0]} has no per-layer KV view; its cache cannot grow in place")
            kernel = kernel_block_sizes[group_id] if kernel_block_sizes and group_id < len(kernel_block_sizes) else None
            views = create_kv_cache_views(self.raw, spec, config.num_blocks, layout, tensor, kernel_block_size=kernel)
            caches.update(zip(tensor.layers, views, strict=True))
        return caches

    def commit(self, num_blocks: int, lend_draft_kv: bool) -> int:
        """Back every page a pool of ``num_blocks`` addresses, before its views are bound (nothing to do on a
        CPU, whose pages are backed on first write). Returns the bytes newly backed."""
        ranges = [region.head(num_blocks) for region in self.regions(draft=False)]
        ranges += [] if lend_draft_kv else [region.head(num_blocks) for region in self.regions(draft=True)]
        return self.pages.commit(ranges)

    def give_back(self, ranges: list[tuple[int, int]]) -> int:
        """Hand these byte ranges' whole pages back. Returns the bytes given back."""
        return self.pages.release(ranges)

    def trim(self, num_blocks: int, lend_draft_kv: bool) -> int:
        """Give back every page a pool of ``num_blocks`` does not address: the target regions' tails, and the
        draft's regions whole when they are lent, else their tails."""
        ranges = [region.tail(num_blocks) for region in self.regions(draft=False)]
        for region in self.regions(draft=True):
            ranges.append(region.tail(0 if lend_draft_kv else num_blocks))
        return self.give_back(ranges)

    def committed_bytes(self, num_blocks: int, lend_draft_kv: bool) -> int:
        """Bytes of the pages a pool of ``num_blocks`` addresses (what the buffer would be, allocated exactly)."""
        return sum(
            part.block_stride * num_blocks * len(part.layers)
            for part in self.tensors
            if not (lend_draft_kv and _is_draft(part))
        )

    def resident_bytes(self) -> int:
        """Bytes of this buffer backed now: by the operating system, or mapped on the device."""
        return self.pages.resident_bytes()
