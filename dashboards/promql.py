"""PromQL for the dashboards: the label selectors, built once from the dashboard variables, and the few
functions the panels combine. Metric names come from ``specserve.metrics_catalog``, never typed here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from specserve import metrics_catalog as catalog

# Grafana's rate window: at least four scrape intervals, widened with the panel's step.
RATE_INTERVAL = "$__rate_interval"

# Dashboard variable -> the label it filters, per family of metrics. Every variable is a regex (All is ".*").
CLUSTER, NODE, MODEL, REPLICA = "cluster", "node", "model", "replica"
VARIABLES = (CLUSTER, NODE, MODEL, REPLICA)
_REPLICA_LABELS = {
    CLUSTER: catalog.RayLabel.SESSION,
    NODE: catalog.RayLabel.NODE,
    MODEL: catalog.MODEL,
    REPLICA: catalog.REPLICA,
}
_VLLM_LABELS = {
    CLUSTER: catalog.RayLabel.SESSION,
    NODE: catalog.RayLabel.NODE,
    MODEL: catalog.VllmLabel.MODEL,
    REPLICA: catalog.VllmLabel.REPLICA,
}
# The controller runs once per cluster, on whichever node Ray placed it: only the cluster filters it.
_CONTROLLER_LABELS = {CLUSTER: catalog.RayLabel.SESSION}


def _selector(labels: Mapping[str, str], variables: Sequence[str]) -> str:
    return "{" + ",".join(f'{labels[v]}=~"${v}"' for v in variables) + "}"


def replica(metric: str) -> str:
    """A specserve replica series, filtered by every variable."""
    return metric + _selector(_REPLICA_LABELS, VARIABLES)


def vllm(metric: str) -> str:
    """A vLLM series as Ray Serve LLM exports it, filtered by every variable."""
    return metric + _selector(_VLLM_LABELS, VARIABLES)


def controller(metric: str) -> str:
    return metric + _selector(_CONTROLLER_LABELS, (CLUSTER,))


def label_values(metric: str, label: str, filtered_by: Sequence[str]) -> str:
    """A variable's query: the values of ``label`` on a replica series, within the variables before it."""
    if not filtered_by:
        return f"label_values({metric}, {label})"
    return f"label_values({metric}{_selector(_REPLICA_LABELS, filtered_by)}, {label})"


def variable_label(variable: str) -> str:
    """The label a variable's values are read from (on replica series)."""
    return str(_REPLICA_LABELS[variable])


def rate(series: str) -> str:
    return f"rate({series}[{RATE_INTERVAL}])"


def sum_by(labels: Sequence[str], expr: str) -> str:
    return f"sum by ({', '.join(labels)}) ({expr})"


def max_by(labels: Sequence[str], expr: str) -> str:
    return f"max by ({', '.join(labels)}) ({expr})"


def quantile(q: float, bucket_series: str, by: Sequence[str] = ()) -> str:
    """The q-quantile of a histogram over the rate window, from its ``_bucket`` series."""
    return f"histogram_quantile({q:g}, {sum_by(('le', *by), rate(bucket_series))})"
