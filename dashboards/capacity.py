"""specserve / Capacity: the KV pool and the draft's memory lent to it, the draft's moves, and the queue."""

from __future__ import annotations

from grafana_foundation_sdk.builders import timeseries
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import units

from dashboards import promql
from dashboards.common import Query, default_timeseries, house_dashboard, steps, with_queries
from specserve import metrics_catalog as catalog

UID = "specserve-capacity"
BY_REPLICA = (catalog.REPLICA,)
BY_TRANSFER = (catalog.REPLICA, catalog.DIRECTION)
BY_VLLM_REPLICA = (catalog.VllmLabel.REPLICA,)
BLOCKS = "suffix: blocks"


def _per_replica(metric: catalog.Metric) -> str:
    return promql.max_by(BY_REPLICA, promql.replica(metric.exported))


def kv_blocks() -> timeseries.Panel:
    return with_queries(
        steps(
            default_timeseries(
                "KV cache blocks",
                "Baseline: the pool with the draft resident. Total: the pool now, above the baseline while the "
                "draft's memory is lent to the KV cache. Used: total minus free.",
                BLOCKS,
            )
        ).min(0),
        Query(_per_replica(catalog.KV_BLOCKS_BASELINE), "{{replica}} baseline"),
        Query(_per_replica(catalog.KV_BLOCKS_TOTAL), "{{replica}} total"),
        Query(f"{_per_replica(catalog.KV_BLOCKS_TOTAL)} - {_per_replica(catalog.KV_BLOCKS_FREE)}", "{{replica}} used"),
    )


def kv_cache_usage() -> timeseries.Panel:
    usage = promql.max_by(BY_VLLM_REPLICA, promql.vllm(catalog.VLLM_KV_CACHE_USAGE.exported))
    return with_queries(
        default_timeseries("KV cache usage", "vLLM's share of the KV cache in use, 0-1.", units.PercentUnit)
        .min(0)
        .max(1),
        Query(usage, "{{ReplicaId}}"),
    )


def draft_residency() -> timeseries.Panel:
    state = promql.max_by((catalog.REPLICA, catalog.STATE), promql.replica(catalog.DRAFT_STATE.exported))
    return with_queries(
        steps(
            default_timeseries(
                "Draft residency",
                "1 for the state the draft is in: resident, offloaded (its memory in the KV pool) or contracting "
                "(the pool draining before the reload).",
                units.Short,
            )
        )
        .min(0)
        .max(1),
        Query(f"{state} == 1", "{{replica}} {{state}}"),
    )


def draft_transfers() -> timeseries.Panel:
    return with_queries(
        steps(
            default_timeseries(
                "Draft transfers",
                "Offloads and reloads since each replica started; a counter appears with its first transfer.",
                units.Short,
            )
        ).min(0),
        Query(
            promql.sum_by(BY_TRANSFER, promql.replica(catalog.DRAFT_TRANSFERS.exported)), "{{replica}} {{direction}}"
        ),
    )


def transfer_duration() -> timeseries.Panel:
    seconds = promql.sum_by(BY_TRANSFER, promql.replica(catalog.DRAFT_TRANSFER_SECONDS.exported))
    count = promql.sum_by(BY_TRANSFER, promql.replica(catalog.DRAFT_TRANSFERS.exported))
    return with_queries(
        steps(
            default_timeseries(
                "Draft transfer duration",
                "Mean seconds per offload and per reload since each replica started; the engine pauses for them.",
                units.Seconds,
            )
        ).min(0),
        Query(f"{seconds} / {count}", "{{replica}} {{direction}}"),
    )


def reload_failures() -> timeseries.Panel:
    return with_queries(
        steps(
            default_timeseries(
                "Draft reload failures",
                "Reloads that failed since each replica started (speculation stays off, serving goes on, the reload "
                "is retried); the counter appears with the first failure.",
                units.Short,
            )
        ).min(0),
        Query(promql.sum_by(BY_REPLICA, promql.replica(catalog.DRAFT_RELOAD_FAILURES.exported)), "{{replica}}"),
    )


def queue() -> timeseries.Panel:
    running = promql.sum_by(BY_VLLM_REPLICA, promql.vllm(catalog.VLLM_NUM_REQUESTS_RUNNING.exported))
    waiting = promql.sum_by(BY_VLLM_REPLICA, promql.vllm(catalog.VLLM_NUM_REQUESTS_WAITING.exported))
    return with_queries(
        default_timeseries("Requests running and waiting", "vLLM's decode batch and admission queue.", units.Short).min(
            0
        ),
        Query(running, "{{ReplicaId}} running"),
        Query(waiting, "{{ReplicaId}} waiting"),
    )


def preemptions() -> timeseries.Panel:
    preempted = promql.sum_by(
        BY_VLLM_REPLICA, promql.rate(promql.vllm(catalog.VLLM_REQUEST_PREEMPTIONS.series("_sum")))
    )
    return with_queries(
        default_timeseries(
            "Preemptions",
            "Requests preempted for KV space, per second, counted when the preempted requests finish.",
            units.Short,
        ).min(0),
        Query(preempted, "{{ReplicaId}}"),
    )


def capacity_dashboard() -> model.Dashboard:
    return house_dashboard(
        UID,
        "specserve / Capacity",
        "KV cache capacity, the draft's memory lent to it and taken back, and the request queue.",
        [
            ("KV cache", [kv_blocks(), kv_cache_usage()]),
            ("Draft memory", [draft_residency(), draft_transfers(), transfer_duration(), reload_failures()]),
            ("Queue", [queue(), preemptions()]),
        ],
    )
