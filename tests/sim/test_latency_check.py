"""The roofline step timer against the papers' step times (latency_check.py, profiles/paper_step_times.yaml)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from specserve.sim.config import LatencyConfig
from specserve.experiments.latency_check import BEFORE, check, error_stats, load_points, predict
from specserve.experiments.papers import STEP_TIMES_FILE
from specserve.sim.profiles import hardware_profiles, model_profiles

# What the per-layer cost achieved (bench/results/latency-check.md): median |ln(predicted / measured)| over
# the absolute points went from 0.307 to 0.095. The guard leaves room for data points to be added.
MAX_MEDIAN_LOG_ERROR = 0.12


def test_data_file_loads_and_names_known_profiles() -> None:
    data = load_points()
    ids = [p.id for p in data.points]
    assert len(ids) == len(set(ids))
    assert {p.paper for p in data.points} >= {"turbospec", "nightjar", "speckv", "dsde", "anchors"}
    for p in data.points:
        assert p.hardware in hardware_profiles(), p.id
        assert p.target in model_profiles() and (p.draft is None or p.draft in model_profiles()), p.id
        assert (p.quantity == "step_ratio") == (p.k_ref is not None), p.id
        assert p.cite and p.paper in STEP_TIMES_FILE.read_text()
    # AdaSpec reports no absolute latency: it appears only among the numbers read and not used.
    assert any(e.paper == "adaspec" for e in data.excluded)


def test_every_point_evaluates() -> None:
    for row in check():
        assert math.isfinite(row.predicted) and row.predicted > 0, row.point.id
        assert math.isfinite(row.predicted_batch_expansion), row.point.id
        if row.point.quantity == "step_s":  # re-reading the KV can only add time
            assert row.predicted_batch_expansion >= row.predicted, row.point.id
        if row.point.quantity == "draft_share":
            assert 0 < row.predicted < 1


def test_anchor_worked_example() -> None:
    # Llama-3.1-8B on an H100 at batch 1, 300 cached tokens: 1 ms step + 0.3 ms forward + 32 layers * 5 us, plus
    # (16.06 GB of weights + 300 * 128 KiB of KV) at 0.8 * 3.35 TB/s = 6.01 ms: 7.47 ms against 1 / 133 tok/s.
    point = next(p for p in load_points().points if p.id == "anchors-vllm-v1-llama3.1-8b-h100-bs1")
    memory_s = (8.03e9 * 2 + 300 * 131072) / (0.8 * 3350e9)
    assert predict(point) == pytest.approx(1e-3 + 3e-4 + 32 * 5e-6 + memory_s, rel=1e-9)
    assert predict(point, BEFORE) == pytest.approx(1e-3 + 3e-4 + memory_s, rel=1e-9)


def test_fractional_k_interpolates_between_whole_steps() -> None:
    point = next(p for p in load_points().points if p.id == "nightjar-table7-dsd")
    at = {k: predict(point.model_copy(update={"k": k})) for k in (1, 2)}
    assert predict(point) == pytest.approx(at[1] + 0.64 * (at[2] - at[1]))


def test_median_error_stays_within_the_achieved_bound() -> None:
    rows = check()
    now, before = error_stats(rows), error_stats(rows, before=True)
    assert now.median_log_error <= MAX_MEDIAN_LOG_ERROR
    assert now.median_log_error < before.median_log_error
    # The eager points the per-layer cost was fitted on, and the CUDA-graph anchor it must not spoil.
    for row in rows:
        if row.point.paper in ("speckv", "anchors"):
            assert row.log_error < 0.1, row.point.id


def test_eager_cost_only_applies_to_eager_points() -> None:
    speckv = next(p for p in load_points().points if p.id == "speckv-phase1-g4")
    as_graphs = speckv.model_copy(update={"cuda_graphs": True})
    cfg = LatencyConfig()
    # 3B target (28 layers) + 4 passes of the 1B draft (16 layers): 92 layers at 90 - 5 us more.
    assert predict(speckv, cfg) - predict(as_graphs, cfg) == pytest.approx(92 * 85e-6)


def sim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specserve", "sim", *args], capture_output=True, text=True, timeout=120)


def test_cli_json_prints_one_document() -> None:
    out = sim("latency-check", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert len(doc["rows"]) == len(load_points().points)
    assert doc["error"]["absolute_after"]["median_log_error"] <= MAX_MEDIAN_LOG_ERROR
    assert doc["written"] == []


def test_cli_table_and_report(tmp_path) -> None:
    out = sim("latency-check", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    # The table is the result (stdout); the files written beside it are logged on stderr.
    assert "speckv-phase1-g4" in out.stdout and "median |ln ratio|" in out.stdout
    md, png = tmp_path / "latency-check.md", tmp_path / "latency-check.png"
    assert out.stderr.splitlines() == [f"wrote {md}", f"wrote {png}"]
    text = md.read_text()
    assert "| `turbospec-fig2-bs50-k2` (step) |" in text and "## Numbers read and not used" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
