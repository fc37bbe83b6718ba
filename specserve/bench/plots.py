"""The two figures of `bench compare`: each policy's median per load point, and its ratio to the best fixed
policy, both with their 95 % bootstrap intervals as error bars."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers

import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend

from specserve.bench.stats import METRICS  # noqa: E402


def _axis(summary: list[dict[str, Any]]) -> tuple[list[float], list[str], str]:
    # Concurrencies double from point to point, so even spacing is a log axis; labels carry the values.
    labels = [e["label"].removeprefix("concurrency ") for e in summary]
    title = "concurrency" if all(e["label"].startswith("concurrency ") for e in summary) else "load"
    return [float(i) for i in range(len(summary))], labels, title


def _series(ax: Any, document: dict[str, Any], summary: list[dict[str, Any]], metric: str, key: str) -> None:
    xs, labels, title = _axis(summary)
    policies = document["policies"]
    # Side by side within a point, so the error bars of close policies stay readable.
    width = 0.5 / max(len(policies), 1)
    for i, policy in enumerate(policies):
        stats = [e["policies"].get(policy, {}).get(metric) for e in summary]
        keep = [j for j, st in enumerate(stats) if st is not None]
        if not keep:
            continue
        x = [xs[j] + (i - (len(policies) - 1) / 2) * width for j in keep]
        y = [stats[j][key] for j in keep]
        low = [stats[j][key] - stats[j][f"{key}_low"] for j in keep]
        high = [stats[j][f"{key}_high"] - stats[j][key] for j in keep]
        style = "--" if policy.startswith("fixed") else "-"
        ax.errorbar(x, y, yerr=[low, high], linestyle=style, marker="o", markersize=3, capsize=2, label=policy)
    ax.set_xticks(xs, labels)
    ax.set_xlabel(title)
    ax.grid(alpha=0.3)


def draw(document: dict[str, Any], summary: list[dict[str, Any]], metric: str, prefix: Path) -> list[Path]:
    """Medians of output tok/s (and of ``metric`` if another), and ``metric``'s ratio to the best fixed."""
    rounds = "/".join(str(n) for n in sorted({e["rounds"] for e in summary}))
    paths = []
    for name in dict.fromkeys(("tok_s", metric)):
        label = METRICS[name].label
        fig, ax = plt.subplots(figsize=(7, 4.5))
        _series(ax, document, summary, name, "median")
        ax.set_ylabel(f"{label} (median over rounds)")
        ax.set_title(f"{document['model']}: {label}, {rounds} interleaved rounds, 95 % CI", fontsize=10)
        paths.append(_save(fig, ax, prefix.with_name(f"{prefix.name}-{name}.png")))

    label = METRICS[metric].label
    fig, ax = plt.subplots(figsize=(7, 4.5))
    _series(ax, document, summary, metric, "ratio")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel(f"{label} ÷ best fixed (per round, median)")
    ax.set_title(f"{document['model']}: {label} relative to the best fixed k, 95 % CI", fontsize=10)
    paths.append(_save(fig, ax, prefix.with_name(f"{prefix.name}-{metric}-ratio.png")))
    return paths


def _save(fig: Any, ax: Any, path: Path) -> Path:
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
