"""deploy/kuberay/podmonitor.yaml scrapes what the RayService's pods export, as often as the alerting rules assume,
and is picked up by the same Prometheus as the rules. (The Prometheus Operator's CRD is not vendored: these check the
file against the other deploy files, not against the operator's schema.)"""

from __future__ import annotations

from deploy_files import DEPLOY, load

PODMONITOR = DEPLOY / "kuberay" / "podmonitor.yaml"
RAYSERVICE = DEPLOY / "kuberay" / "rayservice.yaml"


def test_it_scrapes_the_metrics_port_of_the_head_and_every_worker() -> None:
    (endpoint,) = load(PODMONITOR)["spec"]["podMetricsEndpoints"]
    cluster = load(RAYSERVICE)["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        ports = {p["name"]: p["containerPort"] for c in group["template"]["spec"]["containers"] for p in c["ports"]}
        assert ports[endpoint["port"]] == int(group["rayStartParams"]["metrics-export-port"])


def test_it_selects_every_ray_pod_at_the_rules_interval_with_the_rules_release_label() -> None:
    monitor = load(PODMONITOR)
    assert monitor["kind"] == "PodMonitor" and monitor["apiVersion"] == "monitoring.coreos.com/v1"
    # KubeRay labels every pod of a Ray cluster so; the head is selected too, where the controller exports.
    assert monitor["spec"]["selector"] == {"matchLabels": {"ray.io/is-ray-node": "yes"}}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["interval"] == load(DEPLOY / "prometheus" / "prometheus.yml")["global"]["scrape_interval"]
    rule = load(DEPLOY / "kuberay" / "prometheusrule.yaml")
    assert monitor["metadata"]["labels"]["release"] == rule["metadata"]["labels"]["release"]
