"""The GPU forward-pass fit: it recovers known coefficients, keeps them non-negative, and the profile's
measured fits are the ones the committed measurements give."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from lab.experiments.gpu_fit import Point, fit_all, fit_linear, load
from specserve.sim.profiles import pair_profiles

ROOT = Path(__file__).resolve().parents[2]
MEASURED = sorted((ROOT / "bench" / "results" / "gpu").glob("forward-*.jsonl"))


def _grid(a: float, b: float, c: float) -> list[Point]:
    return [
        Point("m", batch, q, ctx, a * batch * ctx + b * batch * q + c)
        for batch in (1, 4, 16, 64)
        for q in (1, 5)
        for ctx in (0, 512, 4096)
    ]


def test_an_exact_linear_surface_is_recovered() -> None:
    fit = fit_linear(_grid(2e-8, 3e-5, 4e-3))
    assert fit.s_per_context_token == pytest.approx(2e-8, rel=1e-6)
    assert fit.s_per_batched_token == pytest.approx(3e-5, rel=1e-6)
    assert fit.intercept_s == pytest.approx(4e-3, rel=1e-6)


def test_a_coefficient_the_data_would_make_negative_is_dropped_to_zero() -> None:
    # Time falls with context here: an unconstrained fit would price cached tokens negatively.
    points = [Point("m", 1, 1, ctx, 5e-3 - 1e-7 * ctx) for ctx in (100, 1000, 10000)]
    fit = fit_linear(points)
    assert fit.s_per_context_token == 0.0
    assert fit.intercept_s > 0


@pytest.mark.parametrize(
    ("pair", "hardware"),
    [
        ("llama3.1-8b+eagle", "h100"),
        ("llama3.1-8b+eagle", "h200"),
        ("llama3.1-8b+1b", "h100"),
        ("llama2-7b+160m", "h200"),
    ],
)
def test_the_profiles_measured_fits_are_what_the_measurements_give(pair: str, hardware: str) -> None:
    fits = {(f.hardware, f.model): f.fit for f in fit_all(load(MEASURED)[0])}
    profile = pair_profiles()[pair]
    for role, model in (("target", profile.target), ("draft", profile.draft)):
        stored, refit = getattr(profile.linear[hardware], role), fits[(hardware, model)]
        for name in ("s_per_context_token", "s_per_batched_token", "intercept_s"):
            assert math.isclose(getattr(stored, name), getattr(refit, name), rel_tol=5e-3), (role, name)


def test_a_gpu_without_a_hardware_profile_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text(
        json.dumps({"kind": "forward", "gpu": "NVIDIA B200", "model": "m", "B": 1, "q": 1, "c": 1, "ms": 1})
    )
    with pytest.raises(ValueError, match="B200"):
        load([path])
