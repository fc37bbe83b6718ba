"""The dashboards as code: the committed JSON is what the code generates, it parses back into the SDK's model
unchanged, identities are stable, and every query names only metrics the catalog defines."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import prometheus

from dashboards import build, promql
from dashboards.panels import legend, panels_of, resolve
from specserve import metrics_catalog as catalog

COMMITTED = sorted(build.JSON_DIR.glob("*.json"))
# Grafana links, bookmarks and provisioning address dashboards by these: changing one breaks them.
UIDS = {"specserve-speculation", "specserve-capacity", "specserve-cluster"}


def test_the_committed_json_is_what_the_code_generates(tmp_path: Path):
    written = build.write_all(tmp_path)
    assert sorted(p.name for p in written) == [p.name for p in COMMITTED], "run `make dashboards`"
    for path in written:
        assert path.read_bytes() == (build.JSON_DIR / path.name).read_bytes(), f"{path.name}: run `make dashboards`"


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.stem)
def test_each_dashboard_parses_into_the_sdk_model_and_back_unchanged(path: Path):
    text = path.read_text()
    parsed = build.parse(text)
    assert json.dumps(parsed, cls=JSONEncoder, sort_keys=True, indent=2) + "\n" == text
    # Typed, not kept as opaque dictionaries: the queries read back are the ones built.
    targets = [t for p in parsed.panels or [] if isinstance(p, model.Panel) for t in p.targets or []]
    assert targets and all(isinstance(t, prometheus.Dataquery) for t in targets)
    built = next(b for b in build.all_dashboards() if b.uid == parsed.uid)
    assert panels_of(parsed) == panels_of(built)


def test_uids_are_the_published_ones_and_file_names_follow_them():
    boards = build.all_dashboards()
    assert [b.uid for b in boards] == [json.loads(p.read_text())["uid"] for p in map(_committed, boards)]
    assert {b.uid for b in boards} == UIDS and len(boards) == len(UIDS)


def _committed(board: model.Dashboard) -> Path:
    return build.JSON_DIR / f"{board.uid}.json"


def test_panel_ids_are_unique_per_dashboard_and_panel_titles_unique_overall():
    slugs = []
    for board in build.all_dashboards():
        ids = [p.id_val for p in board.panels or []]
        assert len(ids) == len(set(ids)) and 0 not in ids, board.uid
        slugs += [f"{p.dashboard_uid}--{p.slug}" for p in panels_of(board)]
    assert len(slugs) == len(set(slugs)), "each panel renders to its own file"


def test_every_panel_has_queries_a_description_and_a_unit():
    for board in build.all_dashboards():
        for panel in board.panels or []:
            if isinstance(panel, model.Panel):
                assert panel.targets and panel.description, panel.title
                assert panel.field_config is not None and panel.field_config.defaults.unit, panel.title


def _known_series() -> set[str]:
    known = set()
    for metric in (*catalog.ALL_METRICS, *vars(catalog).values()):
        if isinstance(metric, catalog.Metric | catalog.VllmMetric):
            known.add(metric.exported)
            if metric.kind is catalog.Kind.HISTOGRAM:
                known |= {metric.series(s) for s in ("_bucket", "_sum", "_count")}
    return known


def test_every_query_names_only_metrics_the_catalog_defines():
    known = _known_series()
    for board in build.all_dashboards():
        for panel in panels_of(board):
            for expr, _ in panel.targets:
                assert set(re.findall(r"\bray_\w+", expr)) <= known, expr


def test_no_metric_name_is_typed_in_the_dashboard_code():
    for path in sorted(Path(promql.__file__).parent.glob("*.py")):
        strings = [n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)]
        typed = [s for s in strings if isinstance(s, str) and re.search(r"(specserve|vllm)_[a-z]", s)]
        assert not typed, f"{path.name}: {typed}"


def test_variables_filter_by_the_labels_ray_and_the_replica_export():
    board = build.all_dashboards()[0]
    queries = {v.name: v.query for v in board.templating.list_val or []}
    source = catalog.KV_BLOCKS_TOTAL.exported
    assert queries["cluster"] == f"label_values({source}, SessionName)"
    assert queries["node"] == f'label_values({source}{{SessionName=~"$cluster"}}, NodeAddress)'
    assert queries["replica"] == (
        f'label_values({source}{{SessionName=~"$cluster",NodeAddress=~"$node",model=~"$model"}}, replica)'
    )


def test_resolve_puts_in_variable_values_and_the_rate_window():
    expr = promql.rate(promql.replica(catalog.STEPS.exported))
    resolved = resolve(expr, {"replica": "abc", "cluster": "session_1"}, "30s")
    assert resolved == (
        'rate(ray_specserve_steps_total{SessionName=~"session_1",NodeAddress=~".*",model=~".*",replica=~"abc"}[30s])'
    )
    with pytest.raises(ValueError, match="unresolved variable"):
        resolve("up{x=~'$other'}", {}, "1m")


def test_legend_templates_take_the_series_labels():
    assert legend("{{replica}} k = {{ k }}", {"replica": "r1", "k": "2"}) == "r1 k = 2"
    assert legend("{{missing}}x", {}) == "x"
    assert legend("", {"b": "2", "a": "1"}) == '{a="1", b="2"}'
