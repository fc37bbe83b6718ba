"""Every dashboard, and its JSON as committed: keys sorted, two-space indent, one file per dashboard UID."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import dashboard as model

from dashboards.capacity import capacity_dashboard
from dashboards.cluster import cluster_dashboard
from dashboards.speculation import speculation_dashboard

DASHBOARDS: tuple[Callable[[], model.Dashboard], ...] = (speculation_dashboard, capacity_dashboard, cluster_dashboard)
JSON_DIR = Path(__file__).resolve().parent / "json"


def all_dashboards() -> list[model.Dashboard]:
    return [make() for make in DASHBOARDS]


def to_json(board: model.Dashboard) -> str:
    return json.dumps(board, cls=JSONEncoder, sort_keys=True, indent=2) + "\n"


def write_all(out_dir: Path = JSON_DIR) -> list[Path]:
    """Write ``<uid>.json`` for every dashboard; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for board in all_dashboards():
        path = out_dir / f"{board.uid}.json"
        path.write_text(to_json(board))
        written.append(path)
    return written


def parse(text: str) -> model.Dashboard:
    """A dashboard's JSON back into the SDK's model, panels and queries typed (timeseries, prometheus)."""
    register_default_plugins()  # else queries and panel options stay untyped dictionaries
    return model.Dashboard.from_json(json.loads(text))
