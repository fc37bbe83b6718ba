"""Growing a KV buffer in place with CUDA virtual memory, into the bytes a dropped draft gave back; torch and
the CUDA driver only (no vLLM). What the GPU path of elastic draft memory would stand on, checked on a GPU.

    PYTHONPATH=. python3 bench/gpu_vmm.py --out vmm.jsonl [--sizes-gb 0.5,1,2] [--chunks-mb 0,64] [--base-gb 4]
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONPATH=. python3 bench/gpu_vmm.py --only full --out x.jsonl

The buffer (``specserve.replicas.draft_memory.cuda_vmm``, what the KV reserve stands on on a GPU) reserves address
space for the largest pool once (``cuMemAddressReserve``) and maps physical chunks at its tail to grow
(``cuMemCreate`` + ``cuMemMap`` + ``cuMemSetAccess``, then zeroes them) and unmaps them to shrink, so its address
never moves and a CUDA graph captured over it stays valid. One JSON object per line:

- ``granularity``: the driver's minimum and recommended chunk.
- ``resize``: seconds to grow a mapped ``base`` by S bytes and to shrink it back, per chunk size
  (``0`` = the recommended granularity).
- ``graph``: a gather over the buffer captured once as a CUDA graph, replayed on blocks the grow mapped after
  the capture, then on blocks moved back before the shrink; whether both read what was written, and whether
  the buffer's address stayed put.
- ``full``: the offload on a GPU filled to less than the draft's bytes free: free memory as the driver reports
  it after the draft is dropped (does it come back?), whether growing by reallocation (a new buffer of base + S
  and a copy, what a plain tensor needs) fits, the in-place grow and shrink and what they take from free
  memory, and the draft's reload from its pinned host copy. Run it again under expandable segments to see
  whether PyTorch's own allocator changes the reallocation's answer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch

from specserve.replicas.draft_memory.cuda_vmm import Driver, VmmBuffer

GB = 1e9
MB = 1 << 20


def grow(buffer: VmmBuffer, num_bytes: int) -> None:
    """Map ``num_bytes`` more at the tail (zeroed, as the KV reserve maps them)."""
    end = buffer.mapped_bytes + num_bytes
    if end > buffer.size:
        raise ValueError(f"grow by {num_bytes} B past the {buffer.size} B reserved")
    buffer.map(buffer.mapped_bytes, end)


def shrink(buffer: VmmBuffer, num_bytes: int) -> None:
    """Unmap the tail's last ``num_bytes`` (rounded up to whole chunks)."""
    buffer.unmap(buffer.mapped_bytes - -(-num_bytes // buffer.chunk) * buffer.chunk, buffer.mapped_bytes)


def reserve(cu: Driver, *sizes: int, chunk: int = 0) -> VmmBuffer:
    """A buffer with room for grows of each of ``sizes`` in turn (each rounds up to whole chunks)."""
    probe = VmmBuffer(cu, 1, chunk)
    step = probe.chunk
    probe.close()
    return VmmBuffer(cu, sum(-(-size // step) * step for size in sizes), chunk)


def _timed(fn: object, *args: object) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    fn(*args)  # type: ignore[operator]
    torch.cuda.synchronize()
    return time.perf_counter() - started


def resize_rows(cu: Driver, sizes: list[float], chunks_mb: list[int], base: int, reps: int) -> Iterator[dict]:
    for chunk_mb in chunks_mb:
        for size_gb in sizes:
            extra = int(size_gb * GB)
            buffer = reserve(cu, base, extra, chunk=chunk_mb * MB)
            grow(buffer, base)
            grows, shrinks = [], []
            for _ in range(reps):
                grows.append(_timed(grow, buffer, extra))
                shrinks.append(_timed(shrink, buffer, extra))
            yield {
                "kind": "resize",
                "chunk_mb": buffer.chunk / MB,
                "extra_gb": size_gb,
                "grow_s": grows,
                "shrink_s": shrinks,
                "grow_median_s": sorted(grows)[reps // 2],
                "shrink_median_s": sorted(shrinks)[reps // 2],
            }
            buffer.close()


def graph_row(cu: Driver, base: int, extra: int) -> dict:
    """A gather captured before the grow reads blocks mapped after it, and blocks moved back before the shrink."""
    buffer = reserve(cu, base, extra)
    grow(buffer, base)
    block_floats = 64 * 1024  # 256 KiB blocks
    blocks = buffer.tensor().view(torch.float32).view(-1, block_floats)
    address = blocks.data_ptr()
    base_blocks = buffer.mapped_bytes // (4 * block_floats)
    blocks[:base_blocks].copy_(torch.arange(base_blocks, device="cuda", dtype=torch.float32)[:, None])
    picks = 16
    index = torch.arange(picks, device="cuda")
    out = torch.empty(picks, block_floats, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.index_select(blocks, 0, index, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.index_select(blocks, 0, index, out=out)

    grow(buffer, extra)
    grown_blocks = buffer.mapped_bytes // (4 * block_floats)
    new = torch.arange(base_blocks, grown_blocks, device="cuda")
    blocks[base_blocks:grown_blocks].copy_(new.to(torch.float32)[:, None])
    wanted = new[torch.linspace(0, len(new) - 1, picks, device="cuda").long()]
    index.copy_(wanted)
    graph.replay()
    torch.cuda.synchronize()
    grown_ok = bool((out == wanted.to(torch.float32)[:, None]).all())

    # Migrate the picked blocks into the base region (as contraction would), shrink, replay on their new ids.
    targets = torch.arange(picks, device="cuda")
    blocks[targets] = blocks[wanted]
    shrink(buffer, extra)
    index.copy_(targets)
    graph.replay()
    torch.cuda.synchronize()
    moved_ok = bool((out == wanted.to(torch.float32)[:, None]).all())
    row = {
        "kind": "graph",
        "grown_blocks_read": grown_ok,
        "moved_blocks_read": moved_ok,
        "address_kept": blocks.data_ptr() == address == buffer.address,
        "base_blocks": base_blocks,
        "grown_blocks": grown_blocks,
    }
    del graph, blocks
    buffer.close()
    return row


def _all_equal(t: torch.Tensor, value: int) -> bool:
    low, high = torch.aminmax(t)  # no temporary the size of t: the GPU is full here
    return int(low) == int(high) == value


def full_row(cu: Driver, base: int, extra: int) -> dict:
    """The offload and reload on a GPU whose free memory is less than the draft's bytes."""
    free = lambda: torch.cuda.mem_get_info()[0]  # noqa: E731 - the driver's count, what every allocator sees
    buffer = reserve(cu, base, extra)
    grow(buffer, base)
    kv = buffer.tensor()[:base]
    kv.fill_(7)
    draft = torch.full((extra,), 3, dtype=torch.uint8, device="cuda")
    host = torch.empty(extra, dtype=torch.uint8, pin_memory=True)
    host.copy_(draft)
    headroom = extra // 2
    filler = None
    for attempt in range(8):  # the driver keeps some of what it reports free for itself
        try:
            filler = torch.empty(max(free() - headroom - attempt * 256 * MB, 0), dtype=torch.uint8, device="cuda")
            break
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
    row: dict[str, object] = {"kind": "full", "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
    row["extra_gb"], row["base_gb"] = extra / GB, base / GB
    row["free_full_gb"] = free() / GB

    def drop() -> None:
        nonlocal draft
        del draft
        torch.cuda.empty_cache()

    row["drop_s"] = _timed(drop)
    row["free_after_drop_gb"] = free() / GB
    try:
        bigger = torch.empty(base + extra, dtype=torch.uint8, device="cuda")
        bigger[:base].copy_(kv)
        row["reallocation_fits"] = True
        del bigger
    except torch.cuda.OutOfMemoryError:
        row["reallocation_fits"] = False
    torch.cuda.empty_cache()
    before = free()
    row["vmm_grow_s"] = _timed(grow, buffer, extra)
    row["vmm_grow_took_gb"] = (before - free()) / GB
    grown = buffer.tensor()[: base + extra]
    grown[base:].fill_(9)
    row["kv_kept"] = _all_equal(grown[:base], 7) and _all_equal(grown[base:], 9)
    before = free()
    row["vmm_shrink_s"] = _timed(shrink, buffer, extra)
    row["vmm_shrink_gave_gb"] = (free() - before) / GB
    restored = torch.empty(extra, dtype=torch.uint8, device="cuda")
    row["reload_s"] = _timed(restored.copy_, host, True)  # non_blocking, from the pinned copy
    row["reload_ok"] = _all_equal(restored, 3)
    del filler, restored, grown, kv
    buffer.close()
    torch.cuda.empty_cache()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON lines, one per measurement")
    parser.add_argument("--sizes-gb", type=lambda t: [float(x) for x in t.split(",")], default=[0.5, 1.0, 2.0])
    parser.add_argument("--chunks-mb", type=lambda t: [int(x) for x in t.split(",")], default=[0, 64])
    parser.add_argument("--base-gb", type=float, default=4.0, help="KV bytes mapped before the grow")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", choices=["resize", "graph", "full"], help="run one check")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("no CUDA device: this checks CUDA virtual memory")
    if min(args.sizes_gb) <= 0 or args.base_gb <= 0 or args.reps < 1 or min(args.chunks_mb) < 0:
        parser.error("sizes and --base-gb must be positive, chunks non-negative, --reps at least 1")
    cu = Driver(torch.cuda.current_device())
    base, largest = int(args.base_gb * GB), int(max(args.sizes_gb) * GB)
    checks = {
        "resize": lambda: resize_rows(cu, args.sizes_gb, args.chunks_mb, base, args.reps),
        "graph": lambda: [graph_row(cu, base, largest)],
        "full": lambda: [full_row(cu, base, int(s * GB)) for s in args.sizes_gb],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        head = {"kind": "granularity", "device": torch.cuda.get_device_name()}
        head |= {"minimum": cu.granularity(False), "recommended": cu.granularity(True)}
        for row in _chain([head], [check for name, check in checks.items() if args.only in (None, name)]):
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(json.dumps({k: v for k, v in row.items() if not isinstance(v, list)}), file=sys.stderr)
    return 0


def _chain(head: list[dict], checks: list[Callable[[], Iterable[dict]]]) -> Iterator[dict]:
    yield from head
    for check in checks:
        yield from check()


if __name__ == "__main__":
    sys.exit(main())
