"""House style: the default time series panel, queries, the template variables and the dashboard frame.

Every dashboard has the same variables (datasource, cluster, node, model, replica), rows of two panels side by
side, and panel ids numbered in order, so the generated JSON is stable from run to run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard, prometheus, timeseries
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model

from dashboards import promql
from specserve import metrics_catalog as catalog

DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
PANEL_HEIGHT = 8
PANEL_WIDTH = 12  # of Grafana's 24 columns: two panels a row
# The series every replica exports from its first telemetry round; the variables read their values from it.
VARIABLE_SOURCE = catalog.KV_BLOCKS_TOTAL.exported
TAGS = ["specserve"]


@dataclass(frozen=True, slots=True)
class Query:
    expr: str
    # Grafana's legend template: {{label}} is replaced by the series' label value.
    legend: str


def default_timeseries(title: str, description: str, unit: str) -> timeseries.Panel:
    return (
        timeseries.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .height(PANEL_HEIGHT)
        .span(PANEL_WIDTH)
        .line_width(1)
        .fill_opacity(10)
        .show_points(common.VisibilityMode.NEVER)
        .draw_style(common.GraphDrawStyle.LINE)
        .legend(
            common_builders.VizLegendOptions()
            .show_legend(True)
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
        )
        .tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI).sort(common.SortOrder.NONE))
    )


def with_queries(panel: timeseries.Panel, *queries: Query) -> timeseries.Panel:
    for index, query in enumerate(queries):
        panel = panel.with_target(
            prometheus.Dataquery().expr(query.expr).legend_format(query.legend).ref_id(chr(ord("A") + index))
        )
    return panel


def stacked(panel: timeseries.Panel) -> timeseries.Panel:
    """Series stacked on each other: shares that add up to 1."""
    return panel.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL)).fill_opacity(60)


def steps(panel: timeseries.Panel) -> timeseries.Panel:
    """A value that holds until the next sample: a state or a setting, not a measurement."""
    return panel.line_interpolation(common.LineInterpolation.STEP_AFTER)


def variables() -> list[dashboard.QueryVariable | dashboard.DatasourceVariable]:
    """The datasource, then cluster, node, model and replica, each narrowed by the ones before it."""
    found: list[dashboard.QueryVariable | dashboard.DatasourceVariable] = [
        dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
    ]
    labels = {
        promql.CLUSTER: "Cluster (Ray session)",
        promql.NODE: "Node",
        promql.MODEL: "Model",
        promql.REPLICA: "Replica",
    }
    for position, name in enumerate(promql.VARIABLES):
        query = promql.label_values(VARIABLE_SOURCE, promql.variable_label(name), promql.VARIABLES[:position])
        found.append(
            dashboard.QueryVariable(name)
            .label(labels[name])
            .datasource(DATASOURCE)
            .query(query)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(model.VariableSort.ALPHABETICAL_ASC)
        )
    return found


Row = tuple[str, Sequence[timeseries.Panel]]


def house_dashboard(uid: str, title: str, description: str, rows: Sequence[Row]) -> model.Dashboard:
    """The dashboard frame around ``rows`` (title, panels); rows are expanded, panels numbered in order."""
    builder = (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .time("now-1h", "now")
        .refresh("30s")
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .readonly()
    )
    for variable in variables():
        builder = builder.with_variable(variable)
    next_id = 1
    for row_title, panels in rows:
        builder = builder.with_row(dashboard.Row(row_title).collapsed(False).id(next_id))
        next_id += 1
        for panel in panels:
            builder = builder.with_panel(panel.id(next_id))
            next_id += 1
    return builder.build()
