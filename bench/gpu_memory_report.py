"""What elastic draft memory costs on a GPU, from the measurements of bench/gpu_transfer.py and bench/gpu_vmm.py:
a Markdown report and two plots, and the simulator's transfer model checked against the copies.

    python bench/gpu_memory_report.py --measurements bench/results/gpu --out bench/results

Reads ``transfer-<gpu>.jsonl``, ``vmm-<gpu>.jsonl`` and ``vmm-expandable-<gpu>.jsonl`` for every GPU there;
with ``cycle-<run>.jsonl`` of bench/gpu_cycle.py, the whole cycle's section and ``gpu-memory-cycle-<run>.png``;
writes ``gpu-memory.md``, ``gpu-memory-copies.png`` (n concurrent copies: measured against the processor-sharing
model the simulator's ``TransferLink`` and the controller's reload slots assume) and ``gpu-memory-resize.png``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from gpu_cycle_report import section as cycle_section  # noqa: E402  (this script's folder)

from specserve.sim.profiles import hardware_profiles  # noqa: E402
from specserve.sim.transfers import TransferLink  # noqa: E402


def load(folder: Path, prefix: str) -> dict[str, list[dict]]:
    """GPU name (from the file name) -> its rows."""
    out = {}
    for path in sorted(folder.glob(f"{prefix}-*.jsonl")):
        gpu = path.stem.removeprefix(f"{prefix}-")
        if prefix == "vmm" and gpu.startswith("expandable-"):
            continue
        out[gpu] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def modelled_s(size_gb: float, n: int, gb_s: float) -> float:
    """When the last of n equal copies started together ends on a TransferLink of ``gb_s``."""
    link = TransferLink(gb_s * 1e9)
    for owner in range(n):
        link.add(0.0, owner, size_gb * 1e9)
    end = 0.0
    while len(link):
        end = link.next_done_s() or end
        link.pop_done(end)
    return end


def copy_rows(gpu: str, rows: list[dict], gb_s: float) -> list[dict]:
    out = []
    for r in rows:
        if r["kind"] == "copy" and r["host_memory"] == "pinned":
            model = modelled_s(r["size_gb"], r["concurrency"], gb_s)
            out.append({**r, "gpu": gpu, "model_s": model, "error": r["median_s"] / model - 1})
    return out


def plot_copies(copies: list[dict], path: Path) -> None:
    gpus = sorted({c["gpu"] for c in copies})
    fig, axes = plt.subplots(1, len(gpus), figsize=(5.5 * len(gpus), 4), squeeze=False)
    for ax, gpu in zip(axes[0], gpus, strict=True):
        for size in sorted({c["size_gb"] for c in copies}):
            for direction, marker in (("h2d", "o"), ("d2h", "x")):
                pts = [c for c in copies if c["gpu"] == gpu and c["size_gb"] == size and c["direction"] == direction]
                pts.sort(key=lambda c: c["concurrency"])
                ns = [c["concurrency"] for c in pts]
                line = ax.plot(ns, [1e3 * c["median_s"] for c in pts], marker, label=f"{size:g} GB {direction}")
                if direction == "h2d":
                    model = [1e3 * c["model_s"] for c in pts]
                    ax.plot(ns, model, "-", color=line[0].get_color(), alpha=0.5)
        ax.set(xscale="log", yscale="log", xlabel="copies at once", ylabel="until the last ends (ms)", title=gpu)
        ax.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.legend(fontsize=7)
    fig.suptitle("Pinned draft copies sharing one host link: measured (marks) and the simulator's model (lines)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_resize(vmm: dict[str, list[dict]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for gpu, rows in sorted(vmm.items()):
        for chunk in sorted({r["chunk_mb"] for r in rows if r["kind"] == "resize"}):
            pts = sorted(
                (r for r in rows if r["kind"] == "resize" and r["chunk_mb"] == chunk), key=lambda r: r["extra_gb"]
            )
            sizes = [r["extra_gb"] for r in pts]
            ax.plot(sizes, [1e3 * r["grow_median_s"] for r in pts], "o-", label=f"{gpu} grow, {chunk:g} MiB chunks")
            ax.plot(sizes, [1e3 * r["shrink_median_s"] for r in pts], "x--", label=f"{gpu} shrink, {chunk:g} MiB")
    ax.set(
        yscale="log",
        xlabel="bytes mapped or unmapped (GB)",
        ylabel="ms",
        title="KV buffer grown and shrunk in place (CUDA VMM)",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(folder: Path) -> tuple[str, list[dict], dict[str, list[dict]]]:
    transfers, vmm, expandable = load(folder, "transfer"), load(folder, "vmm"), load(folder, "vmm-expandable")
    hardware = hardware_profiles()
    copies = [c for gpu, rows in transfers.items() for c in copy_rows(gpu, rows, hardware[gpu].host_to_device_gb_s)]
    lines = ["# Elastic draft memory on a GPU: copies, KV growth in place, and what a reload costs a step", ""]
    lines += [
        "Measured with torch and the CUDA driver alone (no vLLM) on one GPU of each kind; every figure is a median",
        "(copies over 3 repetitions after a warm-up, VMM resizes over 5). Reproduce on the GPU, then here:",
        "",
        "```",
        "python3 bench/gpu_transfer.py --reps 3 --out bench/results/gpu/transfer-<gpu>.jsonl",
        "PYTHONPATH=. python3 bench/gpu_vmm.py --out bench/results/gpu/vmm-<gpu>.jsonl",
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONPATH=. python3 bench/gpu_vmm.py --only full \\",
        "    --out bench/results/gpu/vmm-expandable-<gpu>.jsonl",
        "python bench/gpu_memory_report.py --measurements bench/results/gpu --out bench/results",
        "```",
        "",
        "## Host link: one copy, and n at once",
        "",
        "| GPU | direction | host memory | 0.5 GB | 1 GB | 2 GB | GB/s (median) |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for gpu, rows in sorted(transfers.items()):
        for direction in ("h2d", "d2h"):
            for memory in ("pinned", "pageable"):
                alone = [r for r in rows if r["kind"] == "copy" and r["concurrency"] == 1]
                alone = sorted(
                    (r for r in alone if r["direction"] == direction and r["host_memory"] == memory),
                    key=lambda r: r["size_gb"],
                )
                cells = " | ".join(f"{1e3 * r['median_s']:.1f} ms" for r in alone)
                rate = statistics.median(r["per_copy_gb_s"] for r in alone)
                lines.append(f"| {gpu} | {direction} | {memory} | {cells} | {rate:.1f} |")
    errors = [abs(c["error"]) for c in copies]
    off = sorted((c for c in copies if abs(c["error"]) > 0.05), key=lambda c: -abs(c["error"]))
    rates = ", ".join(f"{gpu} {hardware[gpu].host_to_device_gb_s:g} GB/s" for gpu in sorted(transfers))
    exceptions = "; ".join(
        f"{c['gpu']} {c['direction']} {c['size_gb']:g} GB, n = {c['concurrency']}: {1e3 * c['median_s']:.1f} ms "
        f"against {1e3 * c['model_s']:.1f}"
        for c in off
    )
    lines += [
        "",
        "![copies](gpu-memory-copies.png)",
        "",
        "n pinned copies started together on their own streams end together, each at 1/n of the link: the",
        "aggregate stays at the single copy's rate. That is the simulator's `TransferLink` (processor sharing) and",
        f"the controller's reload-slot rule. Priced at the hardware profiles' `host_to_device_gb_s` ({rates}), the",
        f"model is within 5 % on {len(copies) - len(off)} of the {len(copies)} pinned copies (both directions,",
        f"n = 1-8; median error {100 * statistics.median(errors):.1f} %)."
        + (f" The exceptions ran slower than modelled: {exceptions}." if off else ""),
        "",
        "Pageable host memory runs at 16-22 GB/s, a third of pinned: it stages through a bounce buffer. The offload",
        "therefore keeps its host copy pinned, made once.",
    ]
    overlaps = [(gpu, r) for gpu, rows in transfers.items() for r in rows if r["kind"] == "overlap"]
    if overlaps:
        lines += ["", "## A reload beside decoding", ""]
        lines += [
            "| GPU | step weights | step alone | step during the copy | steps overlapped | copy alone | copy beside |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for gpu, r in overlaps:
            lines.append(
                f"| {gpu} | {r['weights_gb']:.1f} GB | {1e3 * r['step_alone_median_s']:.2f} ms | "
                f"{1e3 * r['step_during_copy_median_s']:.2f} ms | {r['steps_during_copy']} | "
                f"{1e3 * r['copy_alone_median_s']:.1f} ms | {1e3 * r['copy_during_steps_median_s']:.1f} ms |"
            )
        lines += [
            "",
            "A memory-bound step the size of a 7B model's decode (batch 64 through 14 GB of bf16 weights) is slower",
            "by the ratio of the two step columns while a 2 GB draft copies in on a side stream; the copy itself is",
            "not slowed. The simulator leaves it out: a reload lasts tens of milliseconds, under 0.1 % of a burst.",
        ]
    lines += ["", "## Growing the KV buffer in place (CUDA virtual memory)", ""]
    lines += [
        "| GPU | chunk | grow 0.5 GB | grow 1 GB | grow 2 GB | shrink 2 GB |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for gpu, rows in sorted(vmm.items()):
        for chunk in sorted({r["chunk_mb"] for r in rows if r["kind"] == "resize"}):
            by = {r["extra_gb"]: r for r in rows if r["kind"] == "resize" and r["chunk_mb"] == chunk}
            grows = " | ".join(f"{1e3 * by[s]['grow_median_s']:.2f} ms" for s in sorted(by))
            lines.append(f"| {gpu} | {chunk:g} MiB | {grows} | {1e3 * by[max(by)]['shrink_median_s']:.2f} ms |")
    lines += ["", "![resize](gpu-memory-resize.png)", ""]
    graphs = [(gpu, r) for gpu, rows in sorted(vmm.items()) for r in rows if r["kind"] == "graph"]
    for gpu, r in graphs:
        ok = r["grown_blocks_read"] and r["moved_blocks_read"] and r["address_kept"]
        lines.append(
            f"- {gpu}: a gather captured as a CUDA graph over {r['base_blocks']} blocks read the right bytes from "
            f"blocks mapped after the capture (up to {r['grown_blocks']}) and from blocks moved back before the "
            f"shrink, the address unchanged: {'yes' if ok else 'NO'}."
        )
    lines += ["", "**On a full GPU** (free memory below half the draft's bytes, a 4 GB KV buffer already mapped):", ""]
    lines += [
        "| GPU | allocator | draft | free full | free after drop | reallocation fits | VMM grow took | grow | "
        "shrink gave | reload |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for source in (vmm, expandable):
        for gpu, rows in sorted(source.items()):
            for r in (r for r in rows if r["kind"] == "full"):
                lines.append(
                    f"| {gpu} | {r['alloc_conf'] or 'default'} | {r['extra_gb']:g} GB | {r['free_full_gb']:.2f} GB | "
                    f"{r['free_after_drop_gb']:.2f} GB | {'yes' if r['reallocation_fits'] else 'no'} | "
                    f"{r['vmm_grow_took_gb']:.3f} GB | {1e3 * r['vmm_grow_s']:.1f} ms | "
                    f"{r['vmm_shrink_gave_gb']:.3f} GB | {1e3 * r['reload_s']:.1f} ms |"
                )
    lines += [
        "",
        "Dropping the draft's tensors (and emptying PyTorch's cache) gives its bytes back to the driver at once.",
        "Growing a plain KV tensor into them cannot work there: a new buffer of base + draft bytes needs the old one",
        "alive while it copies, and it does not fit, with PyTorch's expandable segments too. Mapping the draft's",
        "bytes at the tail of a reserved range fits, keeps every block where it was, and gives exactly those bytes",
        "back when unmapped. 2 MiB chunks (the driver's granularity on both GPUs) cost about 20 us each to map",
        "and zero; 64 MiB chunks make a 2 GB grow about a millisecond.",
    ]
    return "\n".join(lines) + "\n", copies, vmm


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measurements", type=Path, default=Path("bench/results/gpu"))
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    if not any(args.measurements.glob("transfer-*.jsonl")):
        parser.error(f"no transfer-<gpu>.jsonl in {args.measurements}")
    text, copies, vmm = report(args.measurements)
    args.out.mkdir(parents=True, exist_ok=True)
    text += "\n".join(cycle_section(args.measurements, args.out))
    (args.out / "gpu-memory.md").write_text(text)
    plot_copies(copies, args.out / "gpu-memory-copies.png")
    plot_resize(vmm, args.out / "gpu-memory-resize.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
