"""specserve / Speculation: what k each replica runs, what it buys (acceptance, tokens per step, goodput) and
what the policy costs."""

from __future__ import annotations

from grafana_foundation_sdk.builders import timeseries
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import units

from dashboards import promql
from dashboards.common import Query, default_timeseries, house_dashboard, stacked, steps, with_queries
from specserve import metrics_catalog as catalog

UID = "specserve-speculation"
TOKENS_PER_S = "suffix: tok/s"
BY_REPLICA = (catalog.REPLICA,)


def k_per_replica() -> timeseries.Panel:
    return with_queries(
        steps(
            default_timeseries(
                "Speculation length k",
                "The k each replica's policy chose for its latest step, and the largest k its engine allows.",
                units.Short,
            )
        ).min(0),
        Query(promql.max_by(BY_REPLICA, promql.replica(catalog.SPECULATION_K.exported)), "{{replica}} k"),
        Query(promql.max_by(BY_REPLICA, promql.replica(catalog.SPECULATION_MAX_K.exported)), "{{replica}} max k"),
    )


def steps_by_k() -> timeseries.Panel:
    rate = promql.rate(promql.replica(catalog.STEPS.exported))
    share = f"{promql.sum_by((catalog.K,), rate)} / ignoring({catalog.K}) group_left sum({rate})"
    return with_queries(
        stacked(
            default_timeseries(
                "Steps by k",
                "Share of engine steps run at each k over the rate window, all selected replicas together.",
                units.PercentUnit,
            )
        )
        .min(0)
        .max(1),
        Query(share, "k = {{k}}"),
    )


def acceptance_by_position() -> timeseries.Panel:
    accepted = promql.sum_by((catalog.POSITION,), promql.rate(promql.replica(catalog.ACCEPTED_TOKENS.exported)))
    reached = promql.sum_by((catalog.POSITION,), promql.rate(promql.replica(catalog.REACHED_DRAFT_TOKENS.exported)))
    return with_queries(
        default_timeseries(
            "Acceptance by draft position",
            "Conditional acceptance: drafts accepted at a position over drafts verified there whose whole prefix "
            "was accepted. Gaps: no draft reached that position in the window.",
            units.PercentUnit,
        )
        .min(0)
        .max(1),
        Query(f"{accepted} / {reached}", "position {{position}}"),
    )


def tokens_per_step() -> timeseries.Panel:
    emitted = promql.sum_by(BY_REPLICA, promql.rate(promql.replica(catalog.EMITTED_TOKENS.exported)))
    num_steps = promql.sum_by(BY_REPLICA, promql.rate(promql.replica(catalog.STEP_DURATION.series("_count"))))
    return with_queries(
        default_timeseries(
            "Tokens per step",
            "Output tokens per engine step, over the whole batch: the batch size times one plus the accepted drafts.",
            "suffix: tok",
        ).min(0),
        Query(f"{emitted} / {num_steps}", "{{replica}}"),
    )


def goodput_and_throughput() -> timeseries.Panel:
    emitted = promql.sum_by(BY_REPLICA, promql.rate(promql.replica(catalog.EMITTED_TOKENS.exported)))
    drafted = promql.sum_by(BY_REPLICA, promql.rate(promql.replica(catalog.DRAFT_TOKENS.exported)))
    accepted = promql.sum_by(BY_REPLICA, promql.rate(promql.replica(catalog.ACCEPTED_TOKENS.exported)))
    return with_queries(
        default_timeseries(
            "Goodput and throughput",
            "Goodput: output tokens per second. Throughput: tokens the target scored per second, output tokens plus "
            "rejected drafts; the gap is speculation's waste. Throughput shows once a replica has drafted.",
            TOKENS_PER_S,
        ).min(0),
        Query(emitted, "{{replica}} goodput"),
        Query(f"{emitted} + {drafted} - {accepted}", "{{replica}} throughput"),
    )


def policy_running() -> timeseries.Panel:
    info = promql.max_by((catalog.REPLICA, catalog.POLICY), promql.replica(catalog.POLICY_INFO.exported))
    return with_queries(
        steps(
            default_timeseries(
                "Policy running",
                "1 while a policy runs on a replica; a switch (`specserve policy set`) starts a new line.",
                units.Short,
            )
        )
        .min(0)
        .max(1),
        Query(f"{info} == 1", "{{replica}} {{policy}}"),
    )


def acceptance_estimate() -> timeseries.Panel:
    ema = promql.max_by((catalog.REPLICA, catalog.POSITION), promql.replica(catalog.ACCEPTANCE_EMA.exported))
    return with_queries(
        default_timeseries(
            "Policy's acceptance estimate",
            "The EMA of conditional acceptance per position that the policy decides on (set once a draft reached "
            "the position).",
            units.PercentUnit,
        )
        .min(0)
        .max(1),
        Query(ema, "{{replica}} position {{position}}"),
    )


def policy_cost() -> timeseries.Panel:
    policy_s = promql.sum_by(BY_REPLICA, promql.rate(promql.replica(catalog.POLICY_SECONDS.exported)))
    step_s = promql.sum_by(BY_REPLICA, promql.rate(promql.replica(catalog.STEP_DURATION.series("_sum"))))
    return with_queries(
        default_timeseries(
            "Policy cost per step",
            "Seconds in the policy's choose and observe over seconds of engine steps: the share of step time the "
            "controller of k takes.",
            units.PercentUnit,
        ).min(0),
        Query(f"{policy_s} / {step_s}", "{{replica}}"),
    )


def speculation_dashboard() -> model.Dashboard:
    return house_dashboard(
        UID,
        "specserve / Speculation",
        "Adaptive speculative decoding per replica: k, acceptance, tokens per step, goodput, the policy.",
        [
            ("Speculation length", [k_per_replica(), steps_by_k()]),
            ("What speculation buys", [acceptance_by_position(), tokens_per_step(), goodput_and_throughput()]),
            ("The policy", [policy_running(), acceptance_estimate(), policy_cost()]),
        ],
    )
