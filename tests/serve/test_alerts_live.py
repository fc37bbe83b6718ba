"""Serve tier: the critical alert on a real engine. `specserve serve` speculates at a fixed k with a draft that
agrees with nothing (the random pair), under load, while its own Prometheus evaluates specserve's alerting rules:
`SpecserveAcceptanceCollapsed` goes pending, then fires, for that replica. (The live dashboards stack, whose trained
pair's drafts are accepted, checks that it does not fire there.)"""

from __future__ import annotations

import pytest
from closed_loop import MODEL, Load
from serve_process import free_port, serving

from specserve import metrics_catalog as catalog
from specserve.cluster import prometheus

ALERT = 'ALERTS{alertname="SpecserveAcceptanceCollapsed"'


# `make test-slow`'s (CI time: 212 s, the alert's own `for:` plus Prometheus' evaluation): the live dashboards stack
# evaluates every alerting rule in CI, and the rule's expression is unit-tested against the catalog.
@pytest.mark.slow
def test_a_draft_that_is_never_accepted_fires_the_acceptance_collapse_alert(tmp_path, random_pair):
    if prometheus.PrometheusServer.binary() is None:
        pytest.skip("Debian's prometheus is not installed (scripts/install.sh installs it when run as root)")
    ports = ["--port", str(free_port()), "--metrics-port", str(free_port()), "--prometheus-port", str(free_port())]
    # The clients' model name: with a target of its own, a config names none but the target's folder.
    config = tmp_path / "serve.yaml"
    config.write_text(f"model_loading_config:\n  model_id: {MODEL}\n")
    pair = ["--config", str(config), "--model", str(random_pair.target), "--draft", str(random_pair.draft)]
    with serving([*ports, *pair, "--policy", "fixed:k=4"], tmp_path) as server:
        url = server.line_matching(r"prometheus: ").split()[1]
        with Load(server.endpoint, clients=2) as load:
            (pending,) = prometheus.wait_for(url, ALERT + "}", timeout_s=240)
            # The rule holds 2 minutes before it fires.
            (firing,) = prometheus.wait_for(url, ALERT + ',alertstate="firing"}', timeout_s=240)
        (reached,) = prometheus.query(url, f"sum({catalog.REACHED_DRAFT_TOKENS.exported})")
        accepted = prometheus.query(url, f"sum({catalog.ACCEPTED_TOKENS.exported})")
    assert firing["metric"][catalog.REPLICA] == pending["metric"][catalog.REPLICA]
    assert firing["metric"]["severity"] == "critical"
    assert all(o.ok for o in load.outcomes), "a useless draft costs speed, never answers"
    # What the alert saw: many drafts verified, almost none accepted.
    kept = float(accepted[0]["value"][1]) if accepted else 0.0
    assert kept < 0.05 * float(reached["value"][1])
