"""The metrics catalog: pure, every name unique and well formed, and the replica registers exactly what it lists."""

from __future__ import annotations

import re

import pytest
from test_import_rules import FRAMEWORKS, PACKAGE_ROOT, breaks, imported_modules

from specserve import metrics_catalog as catalog


def test_the_catalog_imports_no_framework_and_no_other_specserve_module():
    modules = imported_modules(PACKAGE_ROOT / "metrics_catalog.py")
    assert not [m for m in modules if breaks(m, (*FRAMEWORKS, "specserve"))]


def test_names_are_unique_snake_case_with_the_prefix_and_counters_end_in_total():
    names = [m.name for m in catalog.ALL_METRICS]
    assert len(names) == len(set(names))
    for metric in catalog.ALL_METRICS:
        assert re.fullmatch(r"specserve_[a-z0-9_]+", metric.name), metric.name
        # (The gauge kv_blocks_total ends in _total too: it is the pool's total, published before this rule.)
        assert metric.name.endswith("_total") or metric.kind is not catalog.Kind.COUNTER, metric.name
        assert (metric.kind is catalog.Kind.HISTOGRAM) == bool(metric.boundaries), metric.name
        assert metric.exported == "ray_" + metric.name


def test_histogram_series_names_and_the_ones_a_gauge_lacks():
    assert catalog.STEP_DURATION.series("_bucket") == "ray_specserve_step_duration_seconds_bucket"
    assert catalog.VLLM_TIME_TO_FIRST_TOKEN.series("_count") == "ray_vllm_time_to_first_token_seconds_count"
    with pytest.raises(ValueError, match="no '_sum' series"):
        catalog.SPECULATION_K.series("_sum")
    with pytest.raises(ValueError, match="no '_total' series"):
        catalog.STEP_DURATION.series("_total")


# What Prometheus scrapes today: dashboards, alerts and docs/reference/metrics.md name these, so a rename breaks them.
EXPORTED_NAMES = {
    "ray_specserve_speculation_k",
    "ray_specserve_speculation_max_k",
    "ray_specserve_policy_info",
    "ray_specserve_acceptance_ema",
    "ray_specserve_draft_tokens_total",
    "ray_specserve_reached_draft_tokens_total",
    "ray_specserve_accepted_tokens_total",
    "ray_specserve_steps_total",
    "ray_specserve_emitted_tokens_total",
    "ray_specserve_policy_seconds_total",
    "ray_specserve_policy_errors_total",
    "ray_specserve_drafts_cut_total",
    "ray_specserve_step_duration_seconds",
    "ray_specserve_kv_blocks_total",
    "ray_specserve_kv_blocks_free",
    "ray_specserve_kv_blocks_baseline",
    "ray_specserve_draft_state",
    "ray_specserve_draft_transfers_total",
    "ray_specserve_draft_transfer_seconds_total",
    "ray_specserve_draft_transfer_bytes_total",
    "ray_specserve_draft_reload_failures_total",
    "ray_specserve_kv_blocks_migrated_total",
    "ray_specserve_kv_migrate_seconds_total",
    "ray_specserve_acceptance_collapses_total",
    "ray_specserve_acceptance_collapse_state",
    "ray_specserve_speculation_method_info",
    "ray_specserve_num_requests_running",
    "ray_specserve_num_requests_waiting",
    "ray_specserve_controller_connected",
    "ray_specserve_startup_check_failed",
    "ray_specserve_controller_memory_decisions_total",
    "ray_specserve_controller_acceptance_priors_total",
}


def test_the_exported_names_stay_as_published():
    assert {m.exported for m in catalog.ALL_METRICS} == EXPORTED_NAMES


class _Recorder:
    """Stands in for ``ray.util.metrics``: records what a module registers."""

    def __init__(self) -> None:
        self.registered: dict[str, tuple[str, tuple[str, ...], tuple[float, ...]]] = {}

    def factory(self, kind: str):
        recorder = self

        class _Metric:
            def __init__(self, name, description="", tag_keys=(), boundaries=()):
                recorder.registered[name] = (kind, tuple(tag_keys), tuple(boundaries or ()))

            def set_default_tags(self, tags):
                pass

        return _Metric


def test_the_replica_registers_exactly_the_catalogs_replica_metrics(monkeypatch):
    from specserve.replicas.serve import metrics as replica_metrics

    recorder = _Recorder()
    for kind in ("Gauge", "Counter", "Histogram"):
        monkeypatch.setattr(replica_metrics.metrics, kind, recorder.factory(kind.lower()))
    replica_metrics.ReplicaMetrics(model="m", replica="r")
    expected = {m.name: (m.kind.value, m.labels, m.boundaries) for m in catalog.REPLICA_METRICS}
    assert recorder.registered == expected


def test_drafts_cut_are_exported_as_deltas_by_reason(monkeypatch):
    from telemetry_samples import engine_telemetry

    from specserve.replicas.serve import metrics as replica_metrics

    incs: list[tuple[str, float, dict]] = []

    class _Metric:
        def __init__(self, name, description="", tag_keys=(), boundaries=()):
            self.name = name

        def set_default_tags(self, tags):
            pass

        def inc(self, value=1.0, tags=None):
            incs.append((self.name, value, dict(tags or {})))

        def set(self, value, tags=None):
            pass

        def observe(self, value, tags=None):
            pass

    for kind in ("Gauge", "Counter", "Histogram"):
        monkeypatch.setattr(replica_metrics.metrics, kind, _Metric)
    exported = replica_metrics.ReplicaMetrics(model="m", replica="r")
    exported.update(engine_telemetry(num_drafts_capped=2, num_drafts_cut_for_lag=0, num_drafts_cut_by_confidence=5))
    exported.update(engine_telemetry(num_drafts_capped=2, num_drafts_cut_for_lag=1, num_drafts_cut_by_confidence=9))
    cut = [(value, tags[catalog.REASON]) for name, value, tags in incs if name == catalog.DRAFTS_CUT.name]
    assert cut == [(2, "cap"), (5, "confidence"), (1, "lag"), (4, "confidence")]
