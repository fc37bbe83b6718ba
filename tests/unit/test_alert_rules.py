"""The alerting rules: the committed files are what the code generates, every expression names catalog metrics
only, and Prometheus' own rule tester (`promtool test rules`) evaluates each alert on series shaped as Ray
exports them: it fires where it should and stays silent on a healthy replica and on the near misses."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from specserve import metrics_catalog as catalog
from specserve.cluster import alert_rules

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian's prometheus package) is not installed")
LABELS = {catalog.MODEL: "m", catalog.REPLICA: "r", "WorkerId": "w1"}
ALERTS = [a.name for a in alert_rules.alerts()]


def test_the_committed_rules_are_what_the_code_generates(tmp_path: Path):
    rules, operator = alert_rules.write_all(tmp_path / "rules.yml", tmp_path / "operator.yaml")
    assert rules.read_text() == alert_rules.RULES_FILE.read_text(), "run `make dashboards`"
    assert operator.read_text() == alert_rules.OPERATOR_FILE.read_text(), "run `make dashboards`"
    assert yaml.safe_load(operator.read_text())["spec"] == yaml.safe_load(rules.read_text())


def test_every_expression_names_catalog_metrics_only():
    known = {m.exported for m in catalog.ALL_METRICS}
    known |= {
        m.series(s)
        for m in catalog.ALL_METRICS
        if m.kind is catalog.Kind.HISTOGRAM
        for s in ("_sum", "_count", "_bucket")
    }
    for alert in alert_rules.alerts():
        names = set(re.findall(r"\bray_\w+", alert.expr))
        assert names and names <= known, (alert.name, names - known)


def test_the_deployed_prometheus_loads_the_rules_file():
    config = yaml.safe_load((alert_rules.RULES_FILE.parent / "prometheus.yml").read_text())
    assert config["rule_files"] == [alert_rules.RULES_FILE.name]


@needs_promtool
def test_promtool_accepts_the_rules_file():
    run = subprocess.run([PROMTOOL, "check", "rules", str(alert_rules.RULES_FILE)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def series(metric: str, values: str, **labels: str) -> dict[str, str]:
    text = ",".join(f'{k}="{v}"' for k, v in {**LABELS, **labels}.items())
    return {"series": f"{metric}{{{text}}}", "values": values}


def fired(name: str, at: str, **labels: str) -> dict:
    return {
        "eval_time": at,
        "alertname": name,
        "exp_alerts": [{"exp_labels": {"severity": _severity(name), **_replica(), **labels}}],
    }


def silent(name: str, at: str) -> dict:
    return {"eval_time": at, "alertname": name, "exp_alerts": []}


def not_even_pending(name: str, at: str) -> dict:
    """No ALERTS series for ``name`` at ``at``: alert tests see only firing alerts, this sees pending ones too."""
    return {"expr": f'ALERTS{{alertname="{name}"}}', "eval_time": at, "exp_samples": []}


def _severity(name: str) -> str:
    return next(a.severity for a in alert_rules.alerts() if a.name == name)


def _replica() -> dict[str, str]:
    return {catalog.MODEL: "m", catalog.REPLICA: "r"}


ACC, REACHED = catalog.ACCEPTED_TOKENS.exported, catalog.REACHED_DRAFT_TOKENS.exported
STATE = catalog.ACCEPTANCE_COLLAPSE_STATE.exported
HEALTHY = [
    series(REACHED, "0+100x40", position="0"),
    series(ACC, "0+60x40", position="0"),
    series(catalog.POLICY_SECONDS.exported, "0+0.3x40"),
    series(catalog.STEP_DURATION.series("_sum"), "0+60x40"),
    series(catalog.KV_BLOCKS_FREE.exported, "500x40"),
    series(catalog.KV_BLOCKS_TOTAL.exported, "1000x40"),
    series(catalog.NUM_REQUESTS_WAITING.exported, "0x40"),
    series(catalog.DRAFT_TRANSFERS.exported, "1x40", direction="offload"),
    series(catalog.CONTROLLER_CONNECTED.exported, "1x40"),
]
# One minute a sample; Ray exports a counter only from its first event, which "_x5" (absent 5 minutes) shows.
CASES: list[dict] = [
    {
        "name": "a healthy replica raises nothing",
        "series": HEALTHY,
        "tests": [silent(n, "30m") for n in ALERTS],
        "quiet": [not_even_pending(n, t) for n in ALERTS for t in ("1m", "2m", "6m", "30m")],
    },
    {
        "name": "acceptance collapsed: no draft ever accepted, so the accepted counter was never exported",
        "series": [series(REACHED, "0+100x20", position="0")],
        "tests": [silent("SpecserveAcceptanceCollapsed", "2m"), fired("SpecserveAcceptanceCollapsed", "10m")],
    },
    {
        "name": "acceptance collapsed after a k = 0 stretch: the accepted counter stops moving",
        "series": [series(REACHED, "0+100x30", position="0"), series(ACC, "0+60x10 600+0x20", position="0")],
        "tests": [silent("SpecserveAcceptanceCollapsed", "9m"), fired("SpecserveAcceptanceCollapsed", "20m")],
    },
    {
        "name": "a new replica whose first drafts were all rejected: the accepted counter is exported a round later",
        "series": [series(REACHED, "5+100x20", position="0"), series(ACC, "_ 60+60x19", position="0")],
        "tests": [silent("SpecserveAcceptanceCollapsed", "10m")],
        "quiet": [not_even_pending("SpecserveAcceptanceCollapsed", t) for t in ("1m", "2m", "3m", "6m")],
    },
    {
        "name": "a weak but working pair, and a collapse on too few drafts to tell, stay silent",
        "series": [
            series(REACHED, "0+100x20", position="0"),
            series(ACC, "0+20x20", position="0"),
            series(REACHED, "0+10x20", position="0", replica="few"),
        ],
        "tests": [silent("SpecserveAcceptanceCollapsed", "15m")],
    },
    {
        "name": "speculation off for 10 minutes after a collapse fires; a collapse restored in a minute does not",
        "series": [
            series(STATE, "0x2 1x20", state="collapsed"),
            series(STATE, "1x2 0x20", state="healthy"),
            series(STATE, "0x2 1 0x20", state="collapsed", replica="restored"),
            series(STATE, "0x3 1x20", state="probing", replica="restored"),
            series(STATE, "0x20", state="collapsed", replica="other"),
        ],
        "tests": [
            silent("SpecserveSpeculationOffAfterCollapse", "11m"),
            fired("SpecserveSpeculationOffAfterCollapse", "13m"),
        ],
    },
    {
        "name": "a reload's first failure arrives as a new series at 1",
        "series": [series(catalog.DRAFT_RELOAD_FAILURES.exported, "_x5 1x30")],
        "tests": [
            silent("SpecserveDraftReloadFailing", "4m"),
            fired("SpecserveDraftReloadFailing", "5m"),
            fired("SpecserveDraftReloadFailing", "14m"),
            silent("SpecserveDraftReloadFailing", "16m"),
        ],
    },
    {
        "name": "failures again on a replica that failed long ago",
        "series": [series(catalog.DRAFT_RELOAD_FAILURES.exported, "1x20 2 3 3x10")],
        "tests": [silent("SpecserveDraftReloadFailing", "19m"), fired("SpecserveDraftReloadFailing", "22m")],
    },
    {
        "name": "offloads every 3 minutes thrash; every 10 minutes do not",
        "series": [
            series(
                catalog.DRAFT_TRANSFERS.exported,
                "_x2 1+0x2 2+0x2 3+0x2 4+0x2 5+0x2 6+0x2 7+0x2 8+0x10",
                direction="offload",
            ),
            series(
                catalog.DRAFT_TRANSFERS.exported, "_x2 1+0x9 2+0x9 3+0x9 4+0x9", direction="offload", replica="calm"
            ),
        ],
        "tests": [silent("SpecserveDraftThrashing", "18m"), fired("SpecserveDraftThrashing", "24m")],
    },
    {
        "name": "a policy error, first of its kind",
        "series": [series(catalog.POLICY_ERRORS.exported, "_x3 1x10", where="choose")],
        "tests": [fired("SpecservePolicyErrors", "4m", where="choose"), silent("SpecservePolicyErrors", "9m")],
    },
    {
        "name": "the policy's share of step time above the limit for 15 minutes",
        "series": [
            series(catalog.POLICY_SECONDS.exported, "0+12x40"),
            series(catalog.STEP_DURATION.series("_sum"), "0+60x40"),
        ],
        "tests": [silent("SpecservePolicyTimeHigh", "12m"), fired("SpecservePolicyTimeHigh", "25m")],
    },
    {
        "name": "a replica on local rules for minutes fires; one through a controller restart does not",
        "series": [
            series(catalog.CONTROLLER_CONNECTED.exported, "1x5 0x10 1x5"),
            series(catalog.CONTROLLER_CONNECTED.exported, "1x5 0 1x14", replica="restarted"),
        ],
        "tests": [
            silent("SpecserveControllerUnreachable", "5m"),
            fired("SpecserveControllerUnreachable", "8m"),
            silent("SpecserveControllerUnreachable", "17m"),
        ],
    },
    {
        "name": "a full KV cache with a queue fires; a full one without a queue does not",
        "series": [
            series(catalog.KV_BLOCKS_FREE.exported, "10x20"),
            series(catalog.KV_BLOCKS_TOTAL.exported, "1000x20"),
            series(catalog.NUM_REQUESTS_WAITING.exported, "3x20"),
            series(catalog.KV_BLOCKS_FREE.exported, "10x20", replica="idle"),
            series(catalog.KV_BLOCKS_TOTAL.exported, "1000x20", replica="idle"),
            series(catalog.NUM_REQUESTS_WAITING.exported, "0x20", replica="idle"),
        ],
        "tests": [silent("SpecserveKvCacheExhausted", "4m"), fired("SpecserveKvCacheExhausted", "10m")],
    },
]


@needs_promtool
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_promtool_evaluates_the_alert(case: dict, tmp_path: Path):
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(alert_rules.rules_document()))
    tests = [
        {
            "interval": "1m",
            "input_series": case["series"],
            "alert_rule_test": _with_annotations(case["tests"]),
            "promql_expr_test": case.get("quiet", []),
        }
    ]
    suite = tmp_path / "test.yml"
    suite.write_text(yaml.safe_dump({"rule_files": [rules.name], "evaluation_interval": "1m", "tests": tests}))
    run = subprocess.run([PROMTOOL, "test", "rules", str(suite)], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr


def _with_annotations(tests: list[dict]) -> list[dict]:
    """promtool compares annotations too: expand each alert's templates for the replica under test."""
    out = []
    for test in tests:
        alert = next(a for a in alert_rules.alerts() if a.name == test["alertname"])
        expected = []
        for exp in test["exp_alerts"]:
            labels = exp["exp_labels"]
            annotations = {k: _expand(v, labels) for k, v in alert.rule()["annotations"].items()}
            expected.append({"exp_labels": labels, "exp_annotations": annotations})
        out.append({**test, "exp_alerts": expected})
    return out


def _expand(template: str, labels: dict[str, str]) -> str:
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], template)
    return re.sub(r"\{\{ \$value \| humanizePercentage \}\}", "20%", text)
