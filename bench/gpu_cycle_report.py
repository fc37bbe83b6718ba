"""The elastic-draft cycle on a GPU (bench/gpu_cycle.py): a section of bench/gpu_memory_report.py's report and
its plot, step times through offload, expansion, contraction and reload."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt

MB = 1 << 20
DTYPES = {"bfloat16": "bf16", "float32": "fp32"}
COLOURS = {"resident": "tab:blue", "offloaded": "tab:orange", "reloading": "tab:red"}


def load(folder: Path) -> dict[str, list[dict]]:
    """Run name (the file's, without ``cycle-``) -> its rows."""
    runs = {}
    for path in sorted(folder.glob("cycle-*.jsonl")):
        runs[path.stem.removeprefix("cycle-")] = [json.loads(line) for line in path.read_text().splitlines() if line]
    return runs


def _event(rows: list[dict], name: str) -> dict:
    return next(r for r in rows if r["kind"] == "event" and r["name"] == name)


def _reload(issued: dict, reload: dict) -> str:
    """The host's part / the copy's time on its stream (steps run beside it). Runs before the harness stopped
    waiting for the device at ``reload issued`` timed the copy into the host's part and ran no step beside it."""
    if issued["seconds"] >= reload["copy_seconds"]:
        return f"{1e3 * issued['seconds']:.1f} ms host waited for the copy"
    return f"{1e3 * issued['seconds']:.1f} / {1e3 * reload['copy_seconds']:.1f} ms ({reload['steps_during']})"


def plot(name: str, rows: list[dict], path: Path) -> None:
    steps = [r for r in rows if r["kind"] == "step" and r["cycle"]]
    replay = [r for r in rows if r["kind"] == "step" and not r["cycle"]]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.plot([r["step"] for r in replay], [r["ms"] for r in replay], color="grey", lw=0.8, label="replay (no cycle)")
    for state, colour in COLOURS.items():
        mine = [r for r in steps if r["state"] == state]
        ax.scatter([r["step"] for r in mine], [r["ms"] for r in mine], s=7, color=colour, label=f"cycle: {state}")
    ax.set_xlabel("step")
    ax.set_ylabel("step time (ms)")
    ax.set_ylim(0, 2.5 * sorted(r["ms"] for r in steps)[len(steps) // 2])
    twin = ax.twinx()
    twin.plot([r["step"] for r in steps], [r["batch"] for r in steps], color="black", lw=0.8, ls=":")
    twin.set_ylabel("running requests (dotted)")
    ax.set_title(f"Elastic draft cycle on a GPU ({name}): step times", fontsize=10)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def section(folder: Path, out: Path) -> list[str]:
    runs = load(folder)
    if not runs:
        return []
    lines = ["", "## The whole cycle, decoding throughout", ""]
    lines += [
        "`bench/gpu_cycle.py` runs a small decoding engine of its own on the GPU (Llama-shaped target and draft",
        "with random weights, paged KV): its KV cache is the `KvReserve` over CUDA virtual memory, the draft's",
        "weights `ParkedWeights`, and every move is decided by the residency state machine the CPU engine and the",
        "simulator run. A burst fills the pool; free memory is first filled to half the bytes the offload will lend.",
        "A replay of the same admissions with the draft resident throughout and a full-size pool gives the",
        "reference tokens. Reproduce: `PYTHONPATH=. python3 bench/gpu_cycle.py [--small] --out",
        "bench/results/gpu/cycle-<run>.jsonl [--deterministic] [--dtype float32] [--replays 2]` on the GPU.",
        "Deterministic kernels (torch's deterministic algorithms, math attention) make steps several times slower:",
        "their runs are checks of correctness, and their step times are not plotted.",
        "",
        "| run | models | kernels | draft | free before offload | offload | expand (mapped) | "
        "contract (moved, given) | reload: host / copy (steps beside) | catch-up | target tokens = replay | "
        "draft after catch-up = replay | replay = replay |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |",
    ]
    timed = []  # runs whose step times mean something: plotted
    for name, rows in runs.items():
        device = next(r for r in rows if r["kind"] == "device")
        kernels = DTYPES[device.get("dtype", "bfloat16")] + (", deterministic" if device.get("deterministic") else "")
        again = [r for r in rows if r["kind"] == "check replay"]
        replays = "-" if not again else "yes" if all(r["target_tokens_identical"] for r in again) else "no"
        setup = next(r for r in rows if r["kind"] == "setup" and r["cycle"])
        size, check = setup["size"], next(r for r in rows if r["kind"] == "check")
        off, grow, back = _event(rows, "offload"), _event(rows, "expand"), _event(rows, "contract")
        issued, reload, catch = _event(rows, "reload issued"), _event(rows, "reload"), _event(rows, "catch-up")
        models = f"{size['target_layers']} x {size['target_hidden']} / {size['draft_layers']} x {size['draft_hidden']}"
        agreement = check["draft_agreement"]
        identical = "yes" if check["target_tokens_identical"] else f"no ({len(check['requests_differing'])} differ)"
        lines.append(
            f"| {name} | {models} | {kernels} | {setup['draft_bytes'] / MB:.0f} MiB | "
            f"{off['free_before'] / MB:.0f} MiB | "
            f"{1e3 * off['seconds']:.1f} ms, {off['bytes_given'] / MB:.0f} MiB back | "
            f"{1e3 * grow['seconds']:.1f} ms ({grow['bytes_mapped'] / MB:.0f} MiB, {grow['blocks']} blocks) | "
            f"{1e3 * back['seconds']:.1f} ms ({back['moved']}, {back['bytes_given'] / MB:.0f} MiB) | "
            f"{_reload(issued, reload)} | "
            f"{1e3 * catch['seconds']:.0f} ms, {catch['tokens']} tokens | {identical} | "
            f"{'-' if agreement is None else f'{100 * agreement:.1f} %'} | {replays} |"
        )
        if not device.get("deterministic"):
            plot(name, rows, out / f"gpu-memory-cycle-{name}.png")
            timed.append((setup["draft_bytes"], name))
    largest = max(timed)[1]
    lines += ["", f"![cycle](gpu-memory-cycle-{largest}.png)", ""]
    return lines
