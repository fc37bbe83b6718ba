"""Each served way's output tokens/s over bare vLLM's, per concurrency, from ``bench/serve_overhead.py`` reports.

    .venv/bin/python bench/serve_overhead_plot.py LABEL=FILE [LABEL=FILE ...] --out PNG

One panel per report: a marker for every round's ratio (taken within the round) and a bar at the median, with
the 5 % bar drawn in. The round-to-round spread is the point of showing every round.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only

import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend

# One colour per way across panels.
COLORS = {
    "engine": "C0",
    "uni": "C1",
    "vllm": "C2",
    "uni8": "C3",
    "fast": "C4",
    "fast8": "C5",
    "mp": "C6",
    "uni:pinned": "C7",
    "cores": "C8",
}


def per_round_ratios(report: dict, way: str) -> dict[str, list[float]]:
    bare = report.get("compared_with", {}).get(way, "bare")
    out: dict[str, list[float]] = {}
    for r in report["per_round"]:
        for c, point in r[way].items():
            out.setdefault(c, []).append(point["output_tokens_per_s"] / r[bare][c]["output_tokens_per_s"])
    return out


def parse_source(text: str) -> tuple[str, Path]:
    label, sep, path = text.partition("=")
    if not sep or not label or not Path(path).is_file():
        raise argparse.ArgumentTypeError(f"{text!r}: expected LABEL=FILE with an existing FILE")
    return label, Path(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sources", nargs="+", type=parse_source, metavar="LABEL=FILE")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    fig, axes = plt.subplots(
        1, len(args.sources), figsize=(max(6.5, 4.2 * len(args.sources)), 4), sharey=True, squeeze=False
    )
    for ax, (label, path) in zip(axes[0], args.sources, strict=True):
        report = json.loads(path.read_text())
        ways = list(report["over_bare_tokens_per_s"])
        width = 0.8 / len(ways)
        concurrencies = list(per_round_ratios(report, ways[0]))
        for i, way in enumerate(ways):
            for j, values in enumerate(per_round_ratios(report, way).values()):
                x = j + (i - (len(ways) - 1) / 2) * width
                legend = way if j == 0 else None
                color = COLORS.get(way, f"C{len(COLORS) + i}")
                ax.bar(x, statistics.median(values), width * 0.9, color=color, alpha=0.5, label=legend)
                ax.plot([x] * len(values), values, "k.", markersize=4)
        ax.set_xticks(range(len(concurrencies)), [f"c = {c}" for c in concurrencies])
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.axhline(0.95, color="red", linestyle="--", linewidth=0.8)
        ax.set_title(label, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="lower left")
    axes[0][0].set_ylabel("tok/s ÷ bare vLLM (bar: median, dot: round)")
    fig.suptitle(f"{report['config']}, k = {report['k']}: serving overhead (red: the 5 % bar)", fontsize=10)
    axes[0][0].set_ylim(0.5, 1.15)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
