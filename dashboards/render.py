"""Draw every panel of every dashboard to a PNG from a live Prometheus, with matplotlib: no Grafana needed.

Each panel's queries run as Grafana would run them (``query_range`` over the window, the variables resolved,
``$__rate_interval`` set), with the panel's unit, bounds, stacking and legends.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.dates as mdates  # noqa: E402 - after the backend is chosen
import matplotlib.pyplot as plt  # noqa: E402
import requests  # noqa: E402
from matplotlib.ticker import FuncFormatter, PercentFormatter  # noqa: E402

from dashboards.build import all_dashboards  # noqa: E402
from dashboards.panels import PanelQueries, legend, panels_of, resolve  # noqa: E402

# Small files: they are committed and shown in docs/observability/dashboards.md.
FIGSIZE_IN = (6.4, 3.2)
DPI = 80
# About as many points as a Grafana panel of half the screen asks for.
MAX_POINTS = 240


@dataclass(frozen=True, slots=True)
class Series:
    label: str
    times: list[datetime]
    values: list[float]


@dataclass(frozen=True, slots=True)
class Rendered:
    path: Path
    # Series drawn; 0 shows as "No data", as in Grafana.
    num_series: int


class Prometheus:
    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url, self.timeout_s = url.rstrip("/"), timeout_s

    def query_range(self, promql: str, start_s: float, end_s: float, step_s: float) -> list[dict]:
        response = requests.get(
            f"{self.url}/api/v1/query_range",
            params={"query": promql, "start": str(start_s), "end": str(end_s), "step": str(step_s)},
            timeout=self.timeout_s,
        )
        if response.status_code == 400:
            raise ValueError(f"Prometheus rejected {promql!r}: {response.json().get('error')}")
        response.raise_for_status()
        return response.json()["data"]["result"]


def fetch(
    prometheus: Prometheus,
    panel: PanelQueries,
    window: tuple[float, float],
    values: Mapping[str, str],
    rate_interval: str,
) -> list[Series]:
    """Every series of every query of ``panel`` that has a value in the window. Missing samples and NaN (0/0 in a
    ratio) break the line, as in Grafana."""
    start_s, end_s = window
    step_s = max(1.0, (end_s - start_s) / MAX_POINTS)
    found = []
    for expr, template in panel.targets:
        for result in prometheus.query_range(resolve(expr, values, rate_interval), start_s, end_s, step_s):
            points = _with_gaps([(float(t), float(v)) for t, v in result["values"]], step_s)
            if any(math.isfinite(v) for _, v in points):
                times = [datetime.fromtimestamp(t) for t, _ in points]
                found.append(Series(legend(template, result["metric"]), times, [v for _, v in points]))
    return found


def _with_gaps(points: list[tuple[float, float]], step_s: float) -> list[tuple[float, float]]:
    """A NaN point after each sample that the next one does not follow by a step: matplotlib breaks lines there."""
    out: list[tuple[float, float]] = []
    for (t, v), (t_next, _) in zip(points, [*points[1:], (math.inf, 0.0)], strict=True):
        out.append((t, v))
        if t_next - t > 1.5 * step_s and t_next != math.inf:
            out.append((t + step_s, math.nan))
    return out


def draw(panel: PanelQueries, series: list[Series], path: Path) -> None:
    figure, axes = plt.subplots(figsize=FIGSIZE_IN, dpi=DPI)
    if not series:
        axes.text(0.5, 0.5, "No data", ha="center", va="center", transform=axes.transAxes)
    elif panel.stacked:
        _stack(axes, series)
    else:
        style = "steps-post" if panel.step_lines else "default"
        for s in series:
            axes.plot(s.times, s.values, label=s.label, linewidth=1, drawstyle=style)
    axes.set_title(panel.title, fontsize=10, loc="left")
    _apply_unit(axes, panel.unit)
    if panel.min_value is not None:
        axes.set_ylim(bottom=panel.min_value)
    if panel.max_value is not None:
        axes.set_ylim(top=panel.max_value * 1.02)
    axes.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    axes.tick_params(labelsize=7)
    axes.grid(alpha=0.3)
    if series:
        axes.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    plt.close(figure)


def _stack(axes: plt.Axes, series: list[Series]) -> None:
    """Shares on a common time grid: a missing point counts as 0, as Grafana stacks it."""
    times = sorted({t for s in series for t in s.times})
    columns = [[_zero_if_nan(dict(zip(s.times, s.values, strict=True)).get(t, 0.0)) for t in times] for s in series]
    axes.stackplot(times, columns, labels=[s.label for s in series], alpha=0.7)


def _zero_if_nan(value: float) -> float:
    return value if math.isfinite(value) else 0.0


def _apply_unit(axes: plt.Axes, unit: str) -> None:
    if unit == "percentunit":
        axes.yaxis.set_major_formatter(PercentFormatter(1.0))
    elif unit == "s":
        axes.yaxis.set_major_formatter(FuncFormatter(_seconds))
    elif unit.startswith("suffix:"):
        axes.set_ylabel(unit.removeprefix("suffix:").strip(), fontsize=8)


def _seconds(value: float, _position: float) -> str:
    return f"{value * 1e3:g} ms" if abs(value) < 1 else f"{value:g} s"


def render_all(
    prometheus_url: str,
    out_dir: Path,
    window: tuple[float, float],
    values: Mapping[str, str] | None = None,
    rate_interval: str = "1m",
) -> list[Rendered]:
    """One PNG per panel, ``<dashboard uid>--<panel title>.png``, over ``window`` (Unix seconds)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    prometheus = Prometheus(prometheus_url)
    rendered = []
    for board in all_dashboards():
        for panel in panels_of(board):
            path = out_dir / f"{panel.dashboard_uid}--{panel.slug}.png"
            series = fetch(prometheus, panel, window, values or {}, rate_interval)
            draw(panel, series, path)
            rendered.append(Rendered(path, len(series)))
    return rendered
