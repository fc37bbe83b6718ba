"""What a panel asks Prometheus, read back from a built dashboard: for the live test and the renderer, which
must run exactly the PromQL that Grafana runs."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import prometheus

from dashboards import promql


@dataclass(frozen=True, slots=True)
class PanelQueries:
    dashboard_uid: str
    dashboard_title: str
    panel_id: int
    title: str
    # Grafana's unit id: "s", "percentunit", "short", or "suffix: X".
    unit: str
    stacked: bool
    # Drawn as steps: a value that holds until the next sample (a state or a setting).
    step_lines: bool
    min_value: float | None
    max_value: float | None
    # (PromQL with the dashboard variables in it, Grafana legend template)
    targets: tuple[tuple[str, str], ...]

    @property
    def slug(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.title.lower().replace("'", "")).strip("-")


def panels_of(board: model.Dashboard) -> list[PanelQueries]:
    found = []
    for panel in board.panels or []:
        if not isinstance(panel, model.Panel):
            continue  # a row
        defaults = panel.field_config.defaults if panel.field_config is not None else model.FieldConfig()
        custom = defaults.custom
        stacking = getattr(custom, "stacking", None)
        interpolation = getattr(custom, "line_interpolation", None)
        targets = tuple(
            (t.expr, t.legend_format or "") for t in panel.targets or [] if isinstance(t, prometheus.Dataquery)
        )
        found.append(
            PanelQueries(
                dashboard_uid=board.uid or "",
                dashboard_title=board.title or "",
                panel_id=panel.id_val or 0,
                title=panel.title or "",
                unit=defaults.unit or "short",
                stacked=stacking is not None and stacking.mode == "normal",
                step_lines=interpolation == "stepAfter",
                min_value=defaults.min_val,
                max_value=defaults.max_val,
                targets=targets,
            )
        )
    return found


def resolve(expr: str, values: Mapping[str, str], rate_interval: str) -> str:
    """The PromQL Grafana sends: each ``$variable`` replaced by its value (a regex; missing ones by All, ".*") and
    ``$__rate_interval`` by ``rate_interval``."""
    expr = expr.replace(promql.RATE_INTERVAL, rate_interval)
    for name in promql.VARIABLES:
        expr = expr.replace(f"${name}", values.get(name, ".*"))
    if "$" in expr:
        raise ValueError(f"unresolved variable in {expr!r}")
    return expr


def legend(template: str, labels: Mapping[str, str]) -> str:
    """Grafana's legend: ``{{label}}`` replaced by the series' value; no template gives the label set."""
    if not template:
        return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)
