"""specserve / Cluster: where the replicas run, what the controller decides, and request latency."""

from __future__ import annotations

from collections.abc import Sequence

from grafana_foundation_sdk.builders import timeseries
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import units

from dashboards import promql
from dashboards.common import Query, default_timeseries, house_dashboard, steps, with_queries
from specserve import metrics_catalog as catalog

UID = "specserve-cluster"
QUANTILES = (0.5, 0.9, 0.99)


def replicas_by_node() -> timeseries.Panel:
    node = catalog.RayLabel.NODE
    replicas = promql.max_by((node, catalog.REPLICA), promql.replica(catalog.KV_BLOCKS_TOTAL.exported))
    return with_queries(
        steps(default_timeseries("Replicas by node", "Replicas reporting, per Ray node.", units.Short)).min(0),
        Query(f"count by ({node}) ({replicas})", "{{NodeAddress}}"),
    )


def controller_decisions() -> timeseries.Panel:
    decisions = promql.rate(promql.controller(catalog.CONTROLLER_MEMORY_DECISIONS.exported))
    return with_queries(
        default_timeseries(
            "Controller memory decisions",
            "The cluster planner's answers to the replicas' draft transfer wants, per minute: grant_offload, "
            "refuse_offload, grant_reload, queue_reload (reloads share a node's host-to-device link).",
            "suffix: /min",
        ).min(0),
        Query(f"60 * {promql.sum_by((catalog.KIND,), decisions)}", "{{kind}}"),
    )


def controller_connection() -> timeseries.Panel:
    connected = promql.max_by((catalog.REPLICA,), promql.replica(catalog.CONTROLLER_CONNECTED.exported))
    return with_queries(
        steps(
            default_timeseries(
                "Controller connection",
                "1 while the cluster controller answers the replica's telemetry; 0 while the replica runs on local "
                "rules (its own transfer grants, no cluster policy), after three unanswered rounds in a row.",
                units.Short,
            )
        )
        .min(0)
        .max(1),
        Query(connected, "{{replica}}"),
    )


def latency_percentiles(
    title: str, description: str, metric: catalog.VllmMetric, quantiles: Sequence[float] = QUANTILES
) -> timeseries.Panel:
    queries = [Query(promql.quantile(q, promql.vllm(metric.series("_bucket"))), f"p{100 * q:g}") for q in quantiles]
    return with_queries(default_timeseries(title, description, units.Seconds).min(0), *queries)


def time_to_first_token() -> timeseries.Panel:
    return latency_percentiles(
        "Time to first token",
        "From arrival to the first output token, all selected replicas (vLLM's histogram).",
        catalog.VLLM_TIME_TO_FIRST_TOKEN,
    )


def time_per_output_token() -> timeseries.Panel:
    return latency_percentiles(
        "Time per output token",
        "Per request, the decode time over its output tokens after the first (vLLM's histogram).",
        catalog.VLLM_TIME_PER_OUTPUT_TOKEN,
    )


def end_to_end_latency() -> timeseries.Panel:
    return latency_percentiles(
        "End-to-end latency",
        "From arrival to the last output token (vLLM's histogram).",
        catalog.VLLM_E2E_LATENCY,
    )


def cluster_dashboard() -> model.Dashboard:
    return house_dashboard(
        UID,
        "specserve / Cluster",
        "Replicas per node, the controller's draft memory decisions and connection, and request latency percentiles.",
        [
            ("Cluster", [replicas_by_node(), controller_decisions(), controller_connection()]),
            ("Latency", [time_to_first_token(), time_per_output_token(), end_to_end_latency()]),
        ],
    )
