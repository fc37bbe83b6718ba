"""deploy/prometheus/prometheus.yml: Prometheus's own checker accepts it, and it finds the Ray nodes through Ray's
service-discovery file. (tests/serve/test_serve_config_deploy.py scrapes a real cluster with it.)"""

from __future__ import annotations

import shutil
import subprocess

import pytest
from deploy_files import DEPLOY, load

from specserve.cluster import alert_rules

PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian's prometheus package) not installed")


def check(path) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, "check", "config", str(path)], capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool_accepts_it() -> None:
    result = check(PROMETHEUS_CONFIG)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_rejects_a_misspelt_key(tmp_path) -> None:
    broken = tmp_path / "prometheus.yml"
    shutil.copy(alert_rules.RULES_FILE, tmp_path)  # it fails on the key, not the rules
    broken.write_text(PROMETHEUS_CONFIG.read_text().replace("file_sd_configs", "file_sd_config"))
    assert check(broken).returncode != 0
    broken.write_text(PROMETHEUS_CONFIG.read_text())
    assert check(broken).returncode == 0, "the copy alone passes"


def test_it_reads_the_file_ray_keeps_up_to_date() -> None:
    (job,) = load(PROMETHEUS_CONFIG)["scrape_configs"]
    assert job["file_sd_configs"] == [{"files": ["/tmp/ray/prom_metrics_service_discovery.json"]}]
