"""What elastic draft memory would cost on one GPU, torch only (no vLLM): host <-> device copies of a draft's
weights alone and several at once (Nightjar, Appendix E), and growing and shrinking a KV buffer.

    python3 bench/gpu_transfer.py --out transfers.jsonl [--sizes-gb 0.5,1,2] [--concurrency 1,2,4,8] \
        [--kv-gb 8,16] [--reps 5] [--smoke]

**Copies.** Each of n "replicas" holds a draft of S bytes as one pinned host buffer (made once, as the offload
would keep it) and copies it to the device (a reload) or back (an offload) with ``non_blocking`` on a CUDA
stream of its own; all n start together and the time is until the last one ends (CUDA events). One GPU has
one host link, so n copies share it; what the simulator's transfer model assumes (each of n copies at 1/n of
the bandwidth) is checked here. Pageable host memory is timed once per size for comparison (it stages
through a bounce buffer, and is what a host copy not made ahead would cost).

**KV growth.** vLLM 0.32 keeps the KV cache in one buffer per layer group, so growing it into a dropped
draft's bytes means a new buffer and a copy of the old one, which needs old + new bytes at once: the
``kv`` rows time a grow from K to K + S GB and a shrink back, and report the allocator's peak. On a full GPU
that peak does not fit, which is why the engine would need CUDA virtual memory there (see README, Memory
elasticity); this measures what the reallocation costs where it does fit.

**Overlap.** A reload must not stall decoding: a memory-bound step (a batch of 64 through ``--overlap-weights-gb``
of bf16 weights, 14 GB being a 7B model's decode step) is timed alone and while the largest draft copies in on a
side stream; the ``overlap`` row gives both medians and the copy's time alone and under the steps.

One JSON object per line: {"kind": "copy"|"kv"|"overlap", ...}. ``--smoke`` runs one small size of each, to check the
script on a new machine in seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

GB = 1e9


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def time_copies(num_bytes: int, concurrency: int, to_device: bool, pinned: bool, reps: int) -> list[float]:
    """Seconds until the last of ``concurrency`` simultaneous copies of ``num_bytes`` each ends, per rep."""
    count = num_bytes // 2  # bf16 elements
    hosts = [torch.empty(count, dtype=torch.bfloat16, pin_memory=pinned) for _ in range(concurrency)]
    devices = [torch.empty(count, dtype=torch.bfloat16, device="cuda") for _ in range(concurrency)]
    streams = [torch.cuda.Stream() for _ in range(concurrency)]
    out = []
    for _ in range(reps + 1):  # the first rep warms the streams and the driver's mappings
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        ends = []
        for host, device, stream in zip(hosts, devices, streams, strict=True):
            stream.wait_event(start)
            with torch.cuda.stream(stream):
                if to_device:
                    device.copy_(host, non_blocking=True)
                else:
                    host.copy_(device, non_blocking=True)
                end = torch.cuda.Event(enable_timing=True)
                end.record(stream)
            ends.append(end)
        torch.cuda.synchronize()
        out.append(max(start.elapsed_time(end) for end in ends) / 1e3)
    del hosts, devices
    torch.cuda.empty_cache()
    return out[1:]


def time_kv_resize(kv_bytes: int, extra_bytes: int, reps: int) -> Iterator[dict[str, float]]:
    """Grow a KV buffer by ``extra_bytes`` (new buffer, copy, free the old) and shrink it back, per rep."""
    kv = torch.zeros(kv_bytes // 2, dtype=torch.bfloat16, device="cuda")
    for _ in range(reps):
        for grow in (True, False):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            started = time.perf_counter()
            size = kv.numel() + (extra_bytes // 2 if grow else -(extra_bytes // 2))
            new = torch.empty(size, dtype=torch.bfloat16, device="cuda")
            kept = min(size, kv.numel())
            new[:kept].copy_(kv[:kept])
            if grow:
                new[kept:].zero_()
            kv = new
            del new
            torch.cuda.synchronize()
            yield {
                "grow": float(grow),
                "s": time.perf_counter() - started,
                "peak_extra_gb": (torch.cuda.max_memory_allocated() - base) / GB,
            }
    del kv
    torch.cuda.empty_cache()


def _step_times(weights: list[torch.Tensor], x: torch.Tensor, count: int) -> list[torch.cuda.Event]:
    """Record an event before the first of ``count`` steps and after each; the caller synchronizes."""
    events = [torch.cuda.Event(enable_timing=True) for _ in range(count + 1)]
    events[0].record()
    for event in events[1:]:
        for weight in weights:
            torch.mm(x, weight)
        event.record()
    return events


def time_overlap(copy_bytes: int, weight_bytes: int, reps: int) -> dict[str, object]:
    """Decode-like steps alone and while a pinned host-to-device copy runs on a side stream."""
    shape = (8192, 16384)  # 268 MB of bf16 per matrix
    count = max(1, round(weight_bytes / (2 * shape[0] * shape[1])))
    weights = [torch.empty(shape, dtype=torch.bfloat16, device="cuda").normal_() for _ in range(count)]
    x = torch.randn(64, shape[0], dtype=torch.bfloat16, device="cuda")
    host = torch.empty(copy_bytes // 2, dtype=torch.bfloat16, pin_memory=True)
    target = torch.empty(copy_bytes // 2, dtype=torch.bfloat16, device="cuda")
    side = torch.cuda.Stream()
    _step_times(weights, x, 3)
    alone: list[float] = []
    during: list[float] = []
    copy_alone: list[float] = []
    copy_during: list[float] = []
    for _ in range(reps):
        torch.cuda.synchronize()
        events = _step_times(weights, x, 10)
        torch.cuda.synchronize()
        alone += [a.elapsed_time(b) / 1e3 for a, b in zip(events, events[1:], strict=False)]
        copy_alone.append(copy_beside_steps(host, target, side, None)[0])
        copy_s, overlapped = copy_beside_steps(host, target, side, (weights, x, _median(alone) or 0.01))
        copy_during.append(copy_s)
        during += overlapped
    return {
        "kind": "overlap",
        "device": torch.cuda.get_device_name(),
        "weights_gb": count * 2 * shape[0] * shape[1] / GB,
        "copy_gb": copy_bytes / GB,
        "step_alone_median_s": _median(alone),
        "step_during_copy_median_s": _median(during),
        "steps_during_copy": len(during),
        "copy_alone_median_s": _median(copy_alone),
        "copy_during_steps_median_s": _median(copy_during),
    }


def copy_beside_steps(
    host: torch.Tensor,
    target: torch.Tensor,
    side: torch.cuda.Stream,
    overlap: tuple[list[torch.Tensor], torch.Tensor, float] | None,
) -> tuple[float, list[float]]:
    """One copy on ``side``, and with ``overlap`` (weights, input, a step's seconds) steps on the default stream
    meanwhile: the copy's seconds and those of the steps that ended before it did."""
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    side.wait_event(begin)
    with torch.cuda.stream(side):
        target.copy_(host, non_blocking=True)
        end.record(side)
    steps: list[torch.cuda.Event] = []
    if overlap is not None:
        weights, x, step_s = overlap
        expected_s = host.numel() * 2 / 50e9  # enough steps to outlast the copy at a fast link
        steps = _step_times(weights, x, int(expected_s / max(step_s, 1e-4)) + 4)
    torch.cuda.synchronize()
    copy_s = begin.elapsed_time(end) / 1e3
    pairs = zip(steps, steps[1:], strict=False)
    return copy_s, [a.elapsed_time(b) / 1e3 for a, b in pairs if begin.elapsed_time(b) <= copy_s * 1e3]


def _median(values: list[float]) -> float | None:
    return sorted(values)[len(values) // 2] if values else None


def rows(args: argparse.Namespace) -> Iterator[dict[str, object]]:
    device = torch.cuda.get_device_name()
    for size_gb in args.sizes_gb:
        num_bytes = int(size_gb * GB)
        for to_device in (True, False):
            direction = "h2d" if to_device else "d2h"
            for n in args.concurrency:
                seconds = time_copies(num_bytes, n, to_device, pinned=True, reps=args.reps)
                yield _copy_row(device, direction, "pinned", size_gb, n, seconds)
            seconds = time_copies(num_bytes, 1, to_device, pinned=False, reps=args.reps)
            yield _copy_row(device, direction, "pageable", size_gb, 1, seconds)
    for kv_gb in args.kv_gb:
        for size_gb in args.sizes_gb:
            for sample in time_kv_resize(int(kv_gb * GB), int(size_gb * GB), args.reps):
                yield {"kind": "kv", "device": device, "kv_gb": kv_gb, "extra_gb": size_gb, **sample}
    if args.overlap_weights_gb > 0:
        yield time_overlap(int(max(args.sizes_gb) * GB), int(args.overlap_weights_gb * GB), args.reps)


def _copy_row(
    device: str, direction: str, memory: str, size_gb: float, n: int, seconds: list[float]
) -> dict[str, object]:
    median = sorted(seconds)[len(seconds) // 2]
    return {
        "kind": "copy",
        "device": device,
        "direction": direction,
        "host_memory": memory,
        "size_gb": size_gb,
        "concurrency": n,
        "seconds": seconds,
        "median_s": median,
        "aggregate_gb_s": n * size_gb / median,
        "per_copy_gb_s": size_gb / median,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON lines, one per measurement")
    parser.add_argument("--sizes-gb", type=_floats, default=[0.5, 1.0, 2.0], help="draft sizes")
    parser.add_argument("--concurrency", type=_ints, default=[1, 2, 4, 8], help="simultaneous copies")
    parser.add_argument("--kv-gb", type=_floats, default=[8.0, 16.0], help="KV buffer sizes to grow by a draft")
    parser.add_argument("--overlap-weights-gb", type=float, default=14.0, help="the step's weights; 0 skips it")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="one small size of each, to check the script")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("no CUDA device: this benchmark measures a GPU's host link and allocator")
    bad = [v for v in (*args.sizes_gb, *args.kv_gb) if not v > 0] + [n for n in args.concurrency if n < 1]
    if bad or args.reps < 1:
        parser.error(f"sizes and concurrency must be positive and --reps at least 1 (got {bad or args.reps})")
    if args.smoke:
        args.sizes_gb, args.concurrency, args.kv_gb, args.reps = [0.05], [1, 2], [0.2], 2
        args.overlap_weights_gb = min(args.overlap_weights_gb, 0.5)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for row in rows(args):
            f.write(json.dumps(row) + "\n")
            f.flush()
            summary = {k: v for k, v in row.items() if k not in ("seconds", "device")}
            print(json.dumps(summary), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
