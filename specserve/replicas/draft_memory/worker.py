"""Worker side of elastic draft memory: drop and restore the draft's weights, resize the KV pool (vLLM 0.32.0).

Runs in the worker process(es), reached from the EngineCore with ``collective_rpc`` through the methods of
``worker_extension.SpecserveWorkerExtension``. Every call happens between two engine steps, so no forward
pass sees a half-changed model or cache.

- **Drop.** On CPU, vLLM moves each linear layer's weight into a oneDNN handler captured by ``cpu_linear``
  and leaves an empty ``nn.Parameter`` behind, so freeing the parameters alone frees almost nothing: the
  closures go too. The draft's attention layers stay registered (their KV views stay bound), so the KV cache
  can be resized while the draft is away and the restored layers get the views the resize made.
- **Restore.** The draft is rebuilt from its checkpoint by the proposer's own ``_get_model`` (the bytes come
  from the model files: the host copy lives outside the engine's memory, in the page cache), on a thread of its
  own while steps go on at k = 0 (``DraftLoader``); between two steps the new attention layers take the old
  ones' KV views and the attributes vLLM set on them after construction.
- **Migrate.** Live blocks of a region about to be cut are copied, page by page in every layer, to free blocks
  below it, and every request's block ids (``runner.requests`` and the input batch's block tables) follow.
- **Resize.** The KV cache is one backing buffer, each layer a region of pages (layout LBHNC). The first resize
  moves it into a ``kv_reserve.KvReserve``, laid out for the largest pool the offload needs: from then on growing
  and shrinking bind views of another width over the same pages, with nothing copied, and shrinking gives the cut
  pages back to the operating system. Shrinking keeps blocks ``[0, num_blocks)``; the scheduler has emptied the
  rest. While the draft is away the pool holds the target's layers only (the draft's pages of every block are
  lent to it and given back); the contraction lays them out again, zeroed.

Private vLLM interfaces touched (paths under ``vllm/``, vLLM 0.32.0):

- ``GPUModelRunner.drafter`` (``DraftModelProposer``): ``.model``, ``._create_draft_vllm_config()``
  (``v1/spec_decode/draft_model.py:80``) and ``._get_model()`` (103), run on a thread by ``DraftLoader``.
- ``GPUModelRunner.requests[*].block_ids`` and ``.input_batch.block_table.block_tables[*].block_table.np``
  (``v1/worker/block_table.py``), ``.input_batch.num_reqs``: the block ids a step reads.
- ``model_executor/layers/utils.py:555`` ``dispatch_cpu_unquantized_gemm``: the ``cpu_linear`` attribute it sets.
- ``GPUModelRunner.compilation_config.static_forward_context`` (layer name -> attention layer),
  ``.kv_cache_config`` (``KVCacheConfig``: ``num_blocks``, ``kv_cache_tensors`` with ``size``, ``offset``,
  ``layer_stride``, ``block_stride``, ``layers``; ``kv_cache_groups``), ``.kv_caches``, ``.attn_groups``,
  ``._kernel_block_sizes``, ``.device``, ``.cache_config.get_resolved_kv_cache_layout()``.
- ``v1/worker/utils.py``: ``bind_kv_cache`` (811), ``map_kv_caches_to_kernel_blocks``
  (460), ``clear_layer_kv_caches`` (888).
- ``config.set_current_vllm_config``: the draft's layers read the current config while they are built.
- ``model_executor/model_loader/base_loader.py``: its module-level ``gc``, replaced during a rebuild
  (``_no_full_collections``).
- ``Attention.bind_kv_cache`` and attributes set after construction (``v1/attention/backends/cpu_attn.py:157``:
  ``isa``; ``is_draft_layer``).
"""

from __future__ import annotations

import ctypes
import gc
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from copy import deepcopy
from typing import Any

import numpy as np
import torch

from specserve.replicas.draft_memory.kv_reserve import DRAFT_PREFIX, KvReserve

# The dropped draft's attention layers, by name: their KV views are rebound (and resized) while it is away.
_SAVED_LAYERS_ATTR = "_specserve_dropped_draft_layers"
_FULL_KV_CONFIG_ATTR = "_specserve_full_kv_config"
_RESERVE_ATTR = "_specserve_kv_reserve"


def rss_bytes() -> int:
    """This process's resident memory after a trim (freed heap pages handed back): what the operating system sees.

    No garbage collection: a full collection of an engine's heap takes 0.4-0.6 s on this CPU, inside the pause
    between two steps, and the draft's modules go by reference counting (``drop_draft`` keeps no cycle to them).
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc: the number is only less tight
        pass
    with open("/proc/self/statm") as statm:  # vLLM's CPU backend runs on Linux only
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def draft_resident(runner: Any) -> bool:
    drafter = getattr(runner, "drafter", None)
    return drafter is not None and drafter.model is not None


def _full_kv_config(runner: Any) -> Any:
    """The KV layout with the draft's layers, as vLLM made it: kept once, so that a pool resized without the draft's
    pages (``resize_kv(..., lend_draft_kv=True)``) can be laid out with them again."""
    full = getattr(runner, _FULL_KV_CONFIG_ATTR, None)
    if full is None:
        full = deepcopy(runner.kv_cache_config)
        setattr(runner, _FULL_KV_CONFIG_ATTR, full)
    return full


def kv_layout(runner: Any) -> dict[str, int]:
    """Bytes of one KV block over every layer, target and draft (``bytes_per_block``), the draft layers' share of
    it (``draft_kv_bytes_per_block``), and the bytes of the pages the pool addresses now (``buffer_bytes``). Once the
    cache lives in a reserve, also the reserve's address space (``reserved_bytes``) and the bytes of it the
    operating system backs (``resident_bytes``)."""
    full = _full_kv_config(runner)
    (size,) = {tensor.size for tensor in full.kv_cache_tensors}
    draft = sum(
        tensor.block_stride * sum(name.startswith(DRAFT_PREFIX) for name in tensor.layers)
        for tensor in full.kv_cache_tensors
    )
    config = runner.kv_cache_config
    out = {
        "num_blocks": int(config.num_blocks),
        "bytes_per_block": int(size // full.num_blocks),
        "draft_kv_bytes_per_block": int(draft),
    }
    reserve: KvReserve | None = getattr(runner, _RESERVE_ATTR, None)
    if reserve is None:
        (out["buffer_bytes"],) = {int(tensor.size) for tensor in config.kv_cache_tensors}
        return out
    lent = not any(name.startswith(DRAFT_PREFIX) for name in _paged_layers(config))
    out["buffer_bytes"] = reserve.committed_bytes(config.num_blocks, lent)
    out["reserved_bytes"] = reserve.size
    out["buffer_address"] = reserve.raw.data_ptr()
    out["resident_bytes"] = reserve.resident_bytes()
    return out


def drop_draft(runner: Any) -> dict[str, float]:
    """Free the draft's weights. Returns the process's resident bytes before and after."""
    drafter = runner.drafter
    if drafter.model is None:
        raise RuntimeError("the draft is not resident")
    before = rss_bytes()
    forward_context = runner.compilation_config.static_forward_context
    setattr(
        runner,
        _SAVED_LAYERS_ATTR,
        {name: layer for name, layer in forward_context.items() if name.startswith(DRAFT_PREFIX)},
    )
    for module in drafter.model.modules():
        if hasattr(module, "cpu_linear"):
            module.cpu_linear = None
        for parameter in module.parameters(recurse=False):
            parameter.data = torch.empty(0, dtype=parameter.dtype)
    drafter.model = None
    if torch.cuda.is_available():  # hand the freed blocks back from PyTorch's caching allocator (unverified on GPU)
        torch.cuda.empty_cache()
    return {"rss_before": before, "rss_after": rss_bytes()}


class _YoungCollections:
    """Stands in for the ``gc`` module in vLLM's model loader: a collection there covers the youngest generation."""

    @staticmethod
    def collect(generation: int = 2) -> int:
        return gc.collect(0)


@contextmanager
def _no_full_collections() -> Iterator[None]:
    """vLLM's loader runs two full garbage collections of the process's heap per load (``base_loader.py`` 92, 112).
    In a worker serving requests that heap is the engine's: sampled with ``py-spy --gil`` during a reload on perf
    pair S, 254 of the build thread's 274 samples holding the interpreter were in those two calls, and the steps
    waited for them (the longest gap between two steps 0.9-1.0 s against a median of 0.16-0.19 s). The draft's
    modules go by reference counting (``drop_draft``), so nothing needs the full collection."""
    from vllm.model_executor.model_loader import base_loader

    module = base_loader.gc
    base_loader.gc = _YoungCollections
    try:
        yield
    finally:
        base_loader.gc = module


class DraftLoader:
    """One rebuild of the draft from its checkpoint, on a thread of its own so that steps go on meanwhile.

    The build is vLLM's own (``drafter._get_model``); the draft's layer names leave vLLM's layer registry while
    it runs (``Attention.__init__`` refuses a name already registered), which the steps meanwhile do not miss:
    they run at k = 0 and skip every draft pass, and the KV zeroing looks layers up with ``.get``. ``adopt`` gives
    the new layers the old ones' KV views between two steps. A failed build puts the old layers back.
    """

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.model: Any = None
        self.layers: dict[str, Any] = {}
        self.error: BaseException | None = None
        self.rss_before = rss_bytes()
        self.started = time.perf_counter()
        self.seconds = 0.0
        self._thread = threading.Thread(target=self._build, name="specserve-draft-reload", daemon=True)
        self._thread.start()

    @property
    def state(self) -> str:
        if self._thread.is_alive():
            return "loading"
        return "failed" if self.error is not None else "ready"

    def _build(self) -> None:
        from vllm.config import set_current_vllm_config

        # On a CPU the build competes with the steps for the cores: at the lowest priority (which the threads it
        # starts inherit) it takes what the steps leave. Measured on perf pair S: 5-6 steps ran during the build
        # instead of 1, and the longest pause between two steps fell from 0.78 s to 0.40-0.43 s.
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:  # not permitted here: the build competes at the engine's priority
            pass

        forward_context = self.runner.compilation_config.static_forward_context
        old_layers: dict[str, Any] = getattr(self.runner, _SAVED_LAYERS_ATTR)
        for name in old_layers:  # Attention.__init__ refuses a name that is already registered
            forward_context.pop(name, None)
        try:
            with set_current_vllm_config(self.runner.vllm_config), _no_full_collections():
                self.model = self.runner.drafter._get_model()
            self.layers = {name: forward_context[name] for name in old_layers}
        except BaseException as exc:  # reported by ``adopt`` on the engine's thread
            forward_context.update(old_layers)
            self.error = exc
        self.seconds = time.perf_counter() - self.started

    def adopt(self) -> dict[str, float]:
        """Swap the built draft in: its attention layers take the old ones' names, KV views and the attributes
        vLLM set on them after construction. Raises the build's error, leaving the old layers in place."""
        self._thread.join()
        if self.error is not None:
            raise RuntimeError(f"rebuilding the draft failed: {self.error}") from self.error
        runner = self.runner
        forward_context = runner.compilation_config.static_forward_context
        old_layers: dict[str, Any] = getattr(runner, _SAVED_LAYERS_ATTR)
        for name, old in old_layers.items():
            new = forward_context[name]
            new.bind_kv_cache(old.kv_cache)
            fresh = vars(new)
            for attribute, value in vars(old).items():
                if attribute not in fresh and not isinstance(value, torch.nn.Module | torch.nn.Parameter):
                    setattr(new, attribute, value)
            new.is_draft_layer = old.is_draft_layer
        runner.drafter.model = self.model
        setattr(runner, _SAVED_LAYERS_ATTR, {})
        return {"rss_before": self.rss_before, "rss_after": rss_bytes(), "seconds": self.seconds}


def begin_restore(runner: Any) -> DraftLoader:
    if runner.drafter.model is not None:
        raise RuntimeError("the draft is already resident")
    return DraftLoader(runner)


def migrate_blocks(runner: Any, moves: list[tuple[int, int]]) -> dict[str, float]:
    """Copy each ``(source, destination)`` block's pages in every layer's KV, then point every request's block
    ids at the destinations (the scheduler swapped the same blocks in its books, ``kv_pool.migrate``)."""
    started = time.perf_counter()
    sources = torch.tensor([source for source, _ in moves], dtype=torch.long)
    destinations = torch.tensor([destination for _, destination in moves], dtype=torch.long)
    forward_context = {**runner.compilation_config.static_forward_context, **getattr(runner, _SAVED_LAYERS_ATTR, {})}
    caches = {}  # layers that share a cache share its pages: copy them once
    for name in _paged_layers(runner.kv_cache_config):  # a lent draft's layers have no pages to move
        kv = forward_context[name].kv_cache
        if kv.shape[0] != runner.kv_cache_config.num_blocks:  # checked for every layer before any copy
            raise RuntimeError(f"layer {name} binds kernel blocks of another size; cannot migrate its blocks")
        caches[kv.data_ptr()] = kv
    for kv in caches.values():
        kv[destinations] = kv[sources]
    remap = dict(moves)
    for request in runner.requests.values():
        for ids in request.block_ids:
            ids[:] = [remap.get(block, block) for block in ids]
    lookup = np.arange(runner.kv_cache_config.num_blocks, dtype=np.int32)
    lookup[sources.numpy()] = destinations.numpy()
    batch = runner.input_batch
    for table in batch.block_table.block_tables:
        rows = table.block_table.np[: batch.num_reqs]
        rows[:] = lookup[rows]
    return {"seconds": time.perf_counter() - started}


def _paged_layers(config: Any) -> list[str]:
    return [name for tensor in config.kv_cache_tensors for name in tensor.layers]


def _blocks_to_keep(runner: Any, below: int) -> torch.Tensor:
    """Ids below ``below`` whose pages matter: those requests hold, or all of them where prefix caching may hit a
    free block's pages. An idle engine keeps none, so its cache moves into a reserve without a page written."""
    if runner.cache_config.enable_prefix_caching:
        return torch.arange(1, below)
    held = {block for request in runner.requests.values() for ids in request.block_ids for block in ids}
    return torch.tensor(sorted(block for block in held if 0 < block < below), dtype=torch.long)


def resize_kv(runner: Any, num_blocks: int, lend_draft_kv: bool = False, capacity: int = 0) -> dict[str, float]:
    """Lay the KV cache out for ``num_blocks`` blocks, keeping the pages of blocks below both sizes.

    The cache lives in a ``KvReserve`` laid out for ``capacity`` blocks (at least ``num_blocks``): the first resize
    moves vLLM's buffer into one, copying its pages once; every later resize within it binds views of another width
    over the same pages and gives back what the pool no longer addresses, with nothing copied. With
    ``lend_draft_kv`` (the draft is away) the pool holds the target's layers only: the draft's pages of every block
    are lent to it too, and the draft's layers bind an empty cache until a resize without it lays their pages out
    again (zeroed: a rebuilt draft catches its KV up over every request's context).
    """
    from vllm.v1.worker.utils import bind_kv_cache, clear_layer_kv_caches, map_kv_caches_to_kernel_blocks

    old_config = runner.kv_cache_config
    old_n = old_config.num_blocks
    if num_blocks < 2:
        raise ValueError(f"num_blocks={num_blocks}: the pool needs the null block and one more")
    saved_draft_layers = getattr(runner, _SAVED_LAYERS_ATTR, {})
    if lend_draft_kv and draft_resident(runner):
        raise RuntimeError("cannot lend the draft's KV pages while the draft is resident")
    started = time.perf_counter()
    forward_context = {**runner.compilation_config.static_forward_context, **saved_draft_layers}
    reserve: KvReserve | None = getattr(runner, _RESERVE_ATTR, None)
    moved = reserve is None or num_blocks > reserve.capacity
    if moved:
        full = _full_kv_config(runner)
        reserve = KvReserve(full, max(num_blocks, capacity, full.num_blocks), full.num_blocks, runner.device)
    assert reserve is not None
    config = reserve.config(num_blocks, lend_draft_kv)
    reserve.commit(num_blocks, lend_draft_kv)  # a GPU backs a page only once it is mapped
    kv_caches = reserve.views(config, runner.cache_config.get_resolved_kv_cache_layout(), runner._kernel_block_sizes)
    if moved:  # into a new buffer: the pages of the blocks that stay are copied, once
        kept = _blocks_to_keep(runner, min(old_n, num_blocks))
        for name in set(_paged_layers(old_config)) & kv_caches.keys():
            if forward_context[name].kv_cache.shape[0] != old_n:
                raise RuntimeError(f"layer {name} binds kernel blocks of another size; cannot resize its cache")
            if len(kept):
                kv_caches[name][kept] = forward_context[name].kv_cache[kept]
    runner.kv_caches.clear()
    groups = [group for groups in runner.attn_groups for group in groups]
    groups += list(getattr(runner.drafter, "draft_attn_groups", []))
    bind_kv_cache(
        kv_caches,
        forward_context,
        runner.kv_caches,
        1,
        kv_cache_groups=config.kv_cache_groups,
        layer_kv_caches=map_kv_caches_to_kernel_blocks(kv_caches, groups),
    )
    if lend_draft_kv:  # their views still point into the lent pages, which must not be written
        clear_layer_kv_caches(layer for name, layer in saved_draft_layers.items() if name not in kv_caches)
    runner.kv_cache_config = config
    setattr(runner, _RESERVE_ATTR, reserve)
    reserve.trim(num_blocks, lend_draft_kv)
    return {"seconds": time.perf_counter() - started}
