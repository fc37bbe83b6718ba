"""PNG plots for ``python -m lab reproduce``: one function per figure.

matplotlib is imported inside each function with the Agg backend, so importing the simulator never pulls it in
and the plots render without a display.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def throughput_bars(path: Path, title: str, policies: list[str], throughput_tok_s: list[float]) -> Path:
    """Output-token throughput per policy, one bar each."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(policies) + 2), 4))
    bars = ax.bar(range(len(policies)), throughput_tok_s, color="tab:blue")
    ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.set_xticks(range(len(policies)), policies, rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("output throughput (tok/s)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def k_over_time(
    path: Path,
    title: str,
    series: dict[str, list[dict[str, list]]],
    rate_curve: tuple[list[float], list[float]],
    bin_s: float = 2.0,
) -> Path:
    """Mean chosen k per ``bin_s`` window for each policy, over the scenario's arrival rate (step curve).

    ``series`` maps policy -> metrics.k_series (per replica: time_s, k); ``rate_curve`` is (segment edges in
    seconds, rate per segment in requests/s) with one more edge than rates.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    for policy, replicas in series.items():
        times = np.concatenate([np.asarray(r["time_s"], dtype=float) for r in replicas] or [np.zeros(0)])
        ks = np.concatenate([np.asarray(r["k"], dtype=float) for r in replicas] or [np.zeros(0)])
        if not len(times):
            continue
        bins = np.floor(times / bin_s).astype(int)
        sums = np.bincount(bins, weights=ks)
        counts = np.bincount(bins)
        filled = counts > 0
        centres = (np.arange(len(counts)) + 0.5) * bin_s
        ax.plot(centres[filled], sums[filled] / counts[filled], label=policy, linewidth=1.2)
    ax.set_xlabel("time (s)")
    ax.set_ylabel(f"mean k per {bin_s:g} s")
    ax.set_title(title, fontsize=10)
    rate_ax = ax.twinx()
    edges, rates = rate_curve
    rate_ax.stairs(rates, edges, color="grey", linestyle="--", label="arrival rate")
    rate_ax.set_ylabel("arrival rate (req/s)", color="grey")
    lines, labels = ax.get_legend_handles_labels()
    rate_lines, rate_labels = rate_ax.get_legend_handles_labels()
    ax.legend(lines + rate_lines, labels + rate_labels, fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def predicted_vs_measured(path: Path, title: str, panels: list[dict]) -> Path:
    """Log-log predicted against measured with the y = x line, one panel per kind of point.

    Each panel: ``title``, ``unit``, ``scale`` (multiplies values for display) and ``series``, a list of
    (label, measured, predicted, predicted_before) per paper; after is filled, before hollow and faint.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 5), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    from matplotlib import ticker

    for ax, panel in zip(axes[0], panels, strict=True):
        scale, values = panel["scale"], []
        for i, (label, measured, predicted, before) in enumerate(panel["series"]):
            colour = colours[i % len(colours)]
            m, p, b = (scale * np.asarray(v, dtype=float) for v in (measured, predicted, before))
            ax.scatter(m, b, facecolors="none", edgecolors=colour, alpha=0.45, s=28)
            ax.scatter(m, p, color=colour, s=32, label=label)
            values.extend([*m, *p, *b])
        low, high = min(values) / 1.5, max(values) * 1.5
        ax.plot([low, high], [low, high], color="grey", linestyle="--", linewidth=1, label="y = x")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):  # plain numbers at 1-2-5 steps, not 6 x 10^1
            axis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
            axis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        ax.set_xlabel(f"measured ({panel['unit']})")
        ax.set_ylabel(f"predicted ({panel['unit']})")
        ax.set_title(panel["title"], fontsize=10)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ratio_bars(
    path: Path, title: str, labels: list[str], ratios: list[float], bar: float | None, highlight: str | None = None
) -> Path:
    """Horizontal bars of ratios (1 = as good as the best); ``bar`` draws the pass line, ``highlight`` colours
    one label's bar."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.28 * len(labels) + 1.4))
    colours = ["tab:orange" if label == highlight else "tab:blue" for label in labels]
    if bar is not None:
        colours = ["tab:red" if ratio < bar else colour for ratio, colour in zip(ratios, colours, strict=True)]
    ax.barh(range(len(labels)), ratios, color=colours)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    low = min([*ratios, bar or 1.0]) - 0.01
    ax.set_xlim(max(0.0, low), max([*ratios, 1.0]) + 0.005)
    ax.axvline(1.0, color="grey", linewidth=0.8)
    if bar is not None:
        ax.axvline(bar, color="tab:red", linestyle="--", linewidth=1, label=f"bar {bar:g}")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def latency_ratio_bars(
    path: Path,
    title: str,
    labels: list[str],
    series: list[tuple[str, list[float], float | None]],
    highlight: str | None = None,
) -> Path:
    """Horizontal bars of latency ratios (1 = as fast as the reference, lower is better), one group per label and
    one bar per series (name, ratios, pass line or None); a bar past its series' line is red, ``highlight`` colours
    one label's bars."""
    plt = _pyplot()
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(figsize=(8, 0.22 * len(labels) * max(len(series), 1) + 1.6))
    height = 0.8 / max(len(series), 1)
    values: list[float] = []
    for i, (name, ratios, bar) in enumerate(series):
        base = colours[i % len(colours)]
        fills = [
            "tab:red" if bar is not None and ratio > bar else ("tab:orange" if label == highlight else base)
            for label, ratio in zip(labels, ratios, strict=True)
        ]
        positions = [j + (i - (len(series) - 1) / 2) * height for j in range(len(labels))]
        ax.barh(positions, ratios, height=height, color=fills, label=name)
        if bar is not None:
            ax.axvline(bar, color=base, linestyle="--", linewidth=1, label=f"{name} bar {bar:g}")
            values.append(bar)
        values.extend(ratios)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylim(len(labels) - 0.5, -0.5)  # first label on top, no empty rows
    ax.set_xlim(max(0.0, min([*values, 1.0]) - 0.02), max([*values, 1.0]) + 0.02)
    ax.axvline(1.0, color="grey", linewidth=0.8)
    if len(series) > 1 or any(bar is not None for _, _, bar in series):
        ax.legend(fontsize=7, loc="lower right")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
