"""The docs site's generated pages match the code, and every alert has its runbook."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from specserve.cluster import alert_rules, reference_pages

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("page", "render"),
    [
        (reference_pages.CLI_PAGE, reference_pages.cli_page),
        (reference_pages.METRICS_PAGE, reference_pages.metrics_page),
    ],
    ids=["cli", "metrics"],
)
def test_generated_reference_pages_have_no_drift(page, render):
    assert page.read_text() == render(), "run python -m specserve.cluster.reference_pages"


def test_the_cli_page_lists_every_command_and_the_metrics_page_every_series():
    cli_page = reference_pages.cli_page()
    for command in ("serve", "config render", "doctor", "status", "policy set", "bench compare", "sim compare"):
        assert f"## `specserve {command}`" in cli_page
    metrics_page = reference_pages.metrics_page()
    for metric in reference_pages.catalog.ALL_METRICS:
        assert f"`{metric.exported}`" in metrics_page


def _site() -> dict:
    # mkdocs.yml has no custom YAML tags, so a plain safe_load reads it.
    return yaml.safe_load((REPO / "mkdocs.yml").read_text())


def test_every_alert_has_a_runbook_section_its_annotation_points_at():
    assert alert_rules.RUNBOOKS == _site()["site_url"] + "observability/alerts/"
    page = (REPO / "docs" / "observability" / "alerts.md").read_text()
    for alert in alert_rules.alerts():
        assert f"\n### {alert.name}\n" in page, alert.name
        assert alert.rule()["annotations"]["runbook_url"].endswith(f"#{alert.name.lower()}")
        section = page.split(f"### {alert.name}\n", 1)[1].split("\n### ", 1)[0]
        for part in ("**What it means.**", "**What to look at.**", "**What to do.**"):
            assert part in section, (alert.name, part)


def test_every_relative_link_in_the_lab_notebook_resolves():
    # The notebook is not part of the docs site, so mkdocs' strict build does not check its citations.
    broken = []
    for page in sorted((REPO / "lab" / "notebook").glob("*.md")):
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if "://" not in target and not target.startswith("#"):
                if not (page.parent / target.partition("#")[0]).exists():
                    broken.append(f"{page.name}: {target}")
    assert not broken
