"""Prometheus alerting rules for a specserve cluster, built from the metrics catalog so that no metric name is
typed twice.

``python -m specserve.cluster.alert_rules`` writes the rules file every Prometheus of ours loads
(``deploy/prometheus/specserve-alerts.yml``; ``specserve serve --prometheus-port`` writes the same rules
beside its own config) and the Prometheus Operator's ``PrometheusRule`` for KubeRay clusters
(``deploy/kuberay/prometheusrule.yaml``); ``make dashboards`` runs it and a test fails on drift.

Two things about Ray's export shape every expression here:
- Ray does not export a counter before its first increment, so a counter's first event arrives as a new series
  already at 1, which ``increase()`` cannot see (it needs two samples). ``_events`` counts both: the increase of
  series that were there, and series that appeared within the window.
- A counter that never moved is absent, not 0. An alert on a ratio whose numerator may be absent (no draft ever
  accepted: the collapse we want to catch) is written as "denominator large ``unless`` ratio fine".
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from specserve import metrics_catalog as catalog

REPO = Path(__file__).resolve().parents[2]
RULES_FILE = REPO / "deploy" / "prometheus" / "specserve-alerts.yml"
OPERATOR_FILE = REPO / "deploy" / "kuberay" / "prometheusrule.yaml"
GROUP = "specserve"
# Each alert's runbook: a section of the docs site's alerts page, anchored by the alert's name in lower case.
# The site's address is a placeholder until the project is published (mkdocs.yml's site_url; a test keeps them equal).
RUNBOOKS = "https://specserve.readthedocs.io/en/latest/observability/alerts/"
BY_REPLICA = f"{catalog.MODEL}, {catalog.REPLICA}"

# Thresholds, each the reason it is where it is.
# A collapsed acceptance (a stale draft KV after k = 0, weights that came back wrong) reads near 0, while a
# weak but working pair reads 0.2 or more; 100 drafts in 5 minutes keep a handful of verdicts from firing it.
ACCEPTANCE_FLOOR = 0.05
ACCEPTANCE_MIN_DRAFTS = 100
# A collapse the replica restores is over in seconds (a reload and a probe); one that lasts 10 minutes is
# failing restores or probes (whose backoff reaches 2 minutes by then).
COLLAPSE_STUCK = "10m"
# The policy's design target is 1 % of a step; ten times that means the policy, not the model, sets the pace.
POLICY_SHARE_MAX = 0.10
# Nightjar's burst trace adapts once; more than 6 offloads in 30 minutes is a cycle every 5 minutes or less,
# each costing a reload and a catch-up: raise `offload_min_resident_s` or W.
OFFLOADS_PER_30M_MAX = 6
# Requests waiting while under 2 % of the pool is free: the KV cache, not compute, limits the replica.
KV_FREE_MIN = 0.02


@dataclass(frozen=True, slots=True)
class Alert:
    name: str
    expr: str
    for_: str  # how long the expression must hold before the alert fires ("0s": at once)
    severity: str  # critical: users are served wrongly or slowly now; warning: an operator should look
    summary: str
    description: str

    @property
    def runbook_url(self) -> str:
        return f"{RUNBOOKS}#{self.name.lower()}"

    def rule(self) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity},
            "annotations": {"summary": self.summary, "description": self.description, "runbook_url": self.runbook_url},
        }


def _events(metric: catalog.Metric, window: str, by: str, selector: str = "") -> str:
    """Events of a counter over ``window`` per ``by``, counting a first event that arrived as a new series.

    Where the series was there before, its increase; where it appeared within the window, its value (all its
    events fall in the window). ``or`` keeps the left side where both have the label set, so an increase of 0
    on a series that appeared at 1 must drop out first (``> 0``). What it misses: a series that appeared and
    then rose again within the window reads one event short."""
    series = f"{metric.exported}{selector}"
    increased = f"sum by ({by}) (increase({series}[{window}]))"
    appeared = f"sum by ({by}) ({series} unless {series} offset {window})"
    return f"(({increased} > 0) or {appeared})"


def alerts() -> list[Alert]:
    first = f'{{{catalog.POSITION}="0"}}'
    # Both as events, not increase(): a replica whose first drafts were all rejected exports its accepted counter
    # a round after its reached counter, and increase() of a series with one flat sample is 0, not its value.
    drafts = _events(catalog.REACHED_DRAFT_TOKENS, "5m", BY_REPLICA, first)
    kept = _events(catalog.ACCEPTED_TOKENS, "5m", BY_REPLICA, first)
    policy_s = f"sum by ({BY_REPLICA}) (rate({catalog.POLICY_SECONDS.exported}[5m]))"
    step_s = f"sum by ({BY_REPLICA}) (rate({catalog.STEP_DURATION.series('_sum')}[5m]))"
    free, total = catalog.KV_BLOCKS_FREE.exported, catalog.KV_BLOCKS_TOTAL.exported
    waiting = catalog.NUM_REQUESTS_WAITING.exported
    offload = f'{{{catalog.DIRECTION}="offload"}}'
    stuck = f'{{{catalog.STATE}=~"collapsed|restoring"}}'
    return [
        Alert(
            "SpecserveAcceptanceCollapsed",
            f"({drafts} > {ACCEPTANCE_MIN_DRAFTS}) unless ({kept} / {drafts} >= {ACCEPTANCE_FLOOR})",
            "2m",
            "critical",
            "Drafts on {{ $labels.replica }} are almost never accepted",
            f"Under {ACCEPTANCE_FLOOR:.0%} of first-position drafts accepted over 5 minutes while the replica "
            "speculates. A replica acts on a collapse from an acceptance it had established (speculation off, the "
            "draft restored, `specserve_acceptance_collapses_total`), which stops the drafts within seconds, so "
            "this fires for what that leaves: a draft near-useless from the start (the wrong draft, weights broken "
            "at load), or a collapse under the detector's confidence. Every speculating step then costs more than "
            "plain decoding. `specserve policy set fixed:k=0` stops the loss while you look.",
        ),
        Alert(
            "SpecserveSpeculationOffAfterCollapse",
            f"max by ({BY_REPLICA}) ({catalog.ACCEPTANCE_COLLAPSE_STATE.exported}{stuck}) == 1",
            f"{COLLAPSE_STUCK}",
            "warning",
            "{{ $labels.replica }} has kept speculation off since an acceptance collapse",
            f"The replica detected an acceptance collapse and speculation has stayed off for {COLLAPSE_STUCK}: "
            "rebuilding the draft from its checkpoint fails, or the draft cannot be restored on this engine and its "
            "probes keep finding acceptance under the floor. Serving goes on at plain decoding speed; "
            "`specserve status --json` (collapse_last_action, collapse_restore_refusal) says which.",
        ),
        Alert(
            "SpecserveDraftReloadFailing",
            f"{_events(catalog.DRAFT_RELOAD_FAILURES, '10m', BY_REPLICA)} > 0",
            "0s",
            "warning",
            "The draft of {{ $labels.replica }} failed to reload",
            "A draft reload failed in the last 10 minutes: speculation stays off on this replica (serving goes "
            "on) and the reload is retried with a doubling backoff. The replica's log says why (the draft's "
            "checkpoint missing or unreadable, say).",
        ),
        Alert(
            "SpecserveDraftThrashing",
            f"{_events(catalog.DRAFT_TRANSFERS, '30m', BY_REPLICA, offload)} > {OFFLOADS_PER_30M_MAX}",
            "0s",
            "warning",
            "The draft of {{ $labels.replica }} is offloaded and reloaded over and over",
            f"More than {OFFLOADS_PER_30M_MAX} draft offloads in 30 minutes: the load swings across the offload "
            "trigger, and each cycle pays a reload and a catch-up. Raise `offload_min_resident_s` (a dwell after "
            "each reload) or `offload_window_steps`.",
        ),
        Alert(
            "SpecservePolicyErrors",
            f"{_events(catalog.POLICY_ERRORS, '5m', f'{BY_REPLICA}, {catalog.WHERE}')} > 0",
            "0s",
            "warning",
            "The speculation policy of {{ $labels.replica }} is failing ({{ $labels.where }})",
            "The policy raised or answered a k out of range in the last 5 minutes; the engine ran those steps at "
            "k = 0 and went on serving. The replica's log has the traceback.",
        ),
        Alert(
            "SpecservePolicyTimeHigh",
            f"{policy_s} / {step_s} > {POLICY_SHARE_MAX}",
            "15m",
            "warning",
            "The speculation policy takes {{ $value | humanizePercentage }} of {{ $labels.replica }}'s step time",
            f"The policy's choose and observe took more than {POLICY_SHARE_MAX:.0%} of engine step time for 15 "
            "minutes (its target is 1 %): steps are too short for it, or it is misconfigured. A cheaper policy "
            "(`fixed`, `static-table`) costs nearly nothing.",
        ),
        Alert(
            "SpecserveControllerUnreachable",
            f"max by ({BY_REPLICA}) ({catalog.CONTROLLER_CONNECTED.exported}) == 0",
            "1m",
            "warning",
            "{{ $labels.replica }} has run without the cluster controller for a minute",
            "The replica's telemetry went unanswered and it runs on local rules: serving goes on, but the cluster "
            "policy, reload admission, the resident-draft floor and acceptance priors are not applied, and "
            "`specserve status` cannot list replicas. Ray restarts a crashed controller within seconds, so this "
            "is one that hangs or cannot be placed (it runs on the head node).",
        ),
        Alert(
            "SpecserveKvCacheExhausted",
            f"(min by ({BY_REPLICA}) ({free} / {total}) < {KV_FREE_MIN}) and (max by ({BY_REPLICA}) ({waiting}) > 0)",
            "5m",
            "warning",
            "{{ $labels.replica }} queues requests on a full KV cache",
            f"Under {KV_FREE_MIN:.0%} of the KV blocks free with requests waiting for 5 minutes: memory, not "
            "compute, limits this replica. Add replicas, or turn on `draft_offload` so that the draft's memory "
            "joins the pool while speculation is off.",
        ),
    ]


def rules_document() -> dict[str, Any]:
    """A Prometheus rules file (``rule_files:``)."""
    return {"groups": [{"name": GROUP, "rules": [a.rule() for a in alerts()]}]}


def operator_document() -> dict[str, Any]:
    """The same rules as a Prometheus Operator ``PrometheusRule`` (kube-prometheus-stack picks it up by label)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "specserve", "labels": {"release": "kube-prometheus-stack"}},
        "spec": rules_document(),
    }


def dump(document: dict[str, Any], header: str) -> str:
    return header + yaml.safe_dump(document, sort_keys=False, width=120, allow_unicode=True)


RULES_HEADER = (
    "# Generated by `python -m specserve.cluster.alert_rules` (make dashboards): edit the code, not this file.\n"
)
OPERATOR_HEADER = (
    RULES_HEADER
    + "# kubectl apply -f deploy/kuberay/prometheusrule.yaml  (needs the Prometheus Operator's CRDs; match\n"
    "# metadata.labels to your Prometheus' ruleSelector: kube-prometheus-stack selects release: <its release name>)\n"
)


def write_all(rules: Path = RULES_FILE, operator: Path = OPERATOR_FILE) -> list[Path]:
    rules.write_text(dump(rules_document(), RULES_HEADER))
    operator.write_text(dump(operator_document(), OPERATOR_HEADER))
    return [rules, operator]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specserve.cluster.alert_rules", description=__doc__)
    parser.add_argument("--rules", type=Path, default=RULES_FILE, help=f"rules file (default: {RULES_FILE})")
    parser.add_argument(
        "--operator", type=Path, default=OPERATOR_FILE, help=f"PrometheusRule (default: {OPERATOR_FILE})"
    )
    args = parser.parse_args(argv)
    for path in write_all(args.rules, args.operator):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
