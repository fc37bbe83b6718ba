"""Worker side of elastic draft memory: drop and restore the draft's weights, resize the KV pool (vLLM 0.32.0).

Runs in the worker process(es), reached from the EngineCore with ``collective_rpc`` through the methods of
``worker_extension.SpecserveWorkerExtension``. Every call happens between two engine steps, so no forward
pass sees a half-changed model or cache.

- **Drop.** On CPU, vLLM moves each linear layer's weight into a oneDNN handler captured by ``cpu_linear``
  and leaves an empty ``nn.Parameter`` behind, so freeing the parameters alone frees almost nothing: the
  closures go too. The draft's attention layers stay registered (their KV views stay bound), so the KV cache
  can be resized while the draft is away and the restored layers get the views the resize made.
- **Restore.** The draft is rebuilt from its checkpoint by the proposer's own ``_get_model`` (the bytes come
  from the model files: the host copy lives outside the engine's memory, in the page cache). The new
  attention layers take the old ones' KV views and the attributes vLLM set on them after construction.
- **Resize.** The KV cache is one backing buffer, each layer a constant-stride region of ``num_blocks``
  pages (layout LBHNC): growing or shrinking reallocates it and copies the pages that stay, then rebinds
  every layer, target and draft. Shrinking keeps blocks ``[0, num_blocks)``; the scheduler has emptied the rest.

Private vLLM interfaces touched (paths under ``vllm/``, vLLM 0.32.0):

- ``GPUModelRunner.drafter`` (``DraftModelProposer``): ``.model``, ``._get_model()`` (``v1/spec_decode/
  draft_model.py:103``), ``._draft_attn_layer_names``.
- ``model_executor/layers/utils.py:555`` ``dispatch_cpu_unquantized_gemm``: the ``cpu_linear`` attribute it sets.
- ``GPUModelRunner.compilation_config.static_forward_context`` (layer name -> attention layer),
  ``.kv_cache_config`` (``KVCacheConfig``: ``num_blocks``, ``kv_cache_tensors`` with ``size``, ``offset``,
  ``layer_stride``, ``block_stride``, ``layers``; ``kv_cache_groups``), ``.kv_caches``, ``.attn_groups``,
  ``._kernel_block_sizes``, ``.device``, ``.cache_config.get_resolved_kv_cache_layout()``.
- ``v1/worker/utils.py``: ``allocate_kv_cache`` (564), ``bind_kv_cache`` (811), ``map_kv_caches_to_kernel_blocks``
  (460).
- ``config.set_current_vllm_config``: the draft's layers read the current config while they are built.
- ``Attention.bind_kv_cache`` and attributes set after construction (``v1/attention/backends/cpu_attn.py:157``:
  ``isa``; ``is_draft_layer``).
"""

from __future__ import annotations

import ctypes
import gc
import os
import time
from copy import deepcopy
from typing import Any

import torch

_DRAFT_PREFIX = "draft_model."
# The dropped draft's attention layers, by name: their KV views are rebound (and resized) while it is away.
_SAVED_LAYERS_ATTR = "_specserve_dropped_draft_layers"


def rss_bytes() -> int:
    """This process's resident memory after a collection and a trim: what the operating system would see."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc: the number is only less tight
        pass
    with open("/proc/self/statm") as statm:  # vLLM's CPU backend runs on Linux only
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def draft_resident(runner: Any) -> bool:
    drafter = getattr(runner, "drafter", None)
    return drafter is not None and drafter.model is not None


def kv_bytes_per_block(runner: Any) -> int:
    """Bytes one KV block takes over every layer, target and draft (the backing buffer's size per block)."""
    config = runner.kv_cache_config
    (size,) = {tensor.size for tensor in config.kv_cache_tensors}
    return int(size // config.num_blocks)


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
        {name: layer for name, layer in forward_context.items() if name.startswith(_DRAFT_PREFIX)},
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


def restore_draft(runner: Any) -> dict[str, float]:
    """Rebuild the draft from its checkpoint and give its attention layers their KV views back."""
    from vllm.config import set_current_vllm_config

    drafter = runner.drafter
    if drafter.model is not None:
        raise RuntimeError("the draft is already resident")
    before, started = rss_bytes(), time.perf_counter()
    forward_context = runner.compilation_config.static_forward_context
    old_layers: dict[str, Any] = getattr(runner, _SAVED_LAYERS_ATTR)
    for name in old_layers:  # Attention.__init__ refuses a name that is already registered
        del forward_context[name]
    try:
        with set_current_vllm_config(runner.vllm_config):
            drafter.model = drafter._get_model()
    except BaseException:
        forward_context.update(old_layers)  # the old layers keep serving the k = 0 steps
        raise
    for name, old in old_layers.items():
        new = forward_context[name]
        new.bind_kv_cache(old.kv_cache)
        fresh = vars(new)
        for attribute, value in vars(old).items():
            if attribute not in fresh and not isinstance(value, torch.nn.Module | torch.nn.Parameter):
                setattr(new, attribute, value)
        new.is_draft_layer = old.is_draft_layer
    setattr(runner, _SAVED_LAYERS_ATTR, {})
    return {"rss_before": before, "rss_after": rss_bytes(), "seconds": time.perf_counter() - started}


def resize_kv(runner: Any, num_blocks: int) -> dict[str, float]:
    """Reallocate the KV cache for ``num_blocks`` blocks, keeping the pages of blocks below both sizes."""
    from vllm.v1.worker.utils import allocate_kv_cache, bind_kv_cache, map_kv_caches_to_kernel_blocks

    old_config = runner.kv_cache_config
    old_n = old_config.num_blocks
    if num_blocks < 2:
        raise ValueError(f"num_blocks={num_blocks}: the pool needs the null block and one more")
    started = time.perf_counter()
    forward_context = {**runner.compilation_config.static_forward_context, **getattr(runner, _SAVED_LAYERS_ATTR, {})}
    names = [name for group in old_config.kv_cache_groups for name in group.layer_names]
    config = deepcopy(old_config)
    config.num_blocks = num_blocks
    offset = 0
    for tensor in config.kv_cache_tensors:  # layer-outermost: every layer's region scales with the blocks
        if tensor.layer_stride != tensor.block_stride * old_n:
            raise RuntimeError("the KV cache is not laid out layer-outermost (LBHNC); cannot resize it")
        tensor.layer_stride = tensor.block_stride * num_blocks
        tensor.offset = offset
        offset += tensor.layer_stride * len(tensor.layers)
    for tensor in config.kv_cache_tensors:
        tensor.size = offset
    kv_caches = allocate_kv_cache(
        config, runner.device, runner.cache_config.get_resolved_kv_cache_layout(), runner._kernel_block_sizes
    )
    kept = min(old_n, num_blocks)
    for name in names:
        if forward_context[name].kv_cache.shape[0] != old_n:
            raise RuntimeError(f"layer {name} binds kernel blocks of another size; cannot resize its cache")
        kv_caches[name][:kept].copy_(forward_context[name].kv_cache[:kept])
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
    runner.kv_cache_config = config
    return {"seconds": time.perf_counter() - started}
