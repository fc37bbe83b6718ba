"""``python -m lab gpu-fit``: fit TurboSpec Eq. 3 to measured GPU forward passes and check it on held-out points.

The measurements come from ``bench/gpu_forward.py`` (torch-level forwards of Llama-shaped models on one GPU,
one JSON row per point). For each GPU and model the fit is T = a * N_context + b * N_batched + c, weighted
so that every point counts by its relative error (the grid spans 0.1 ms to 100 ms), with every coefficient
kept non-negative as the profile schema requires. Every fourth point, in grid order, is held out and
priced by the fit of the other three quarters: that error is the one the report quotes. The same points
are also priced by the simulator's roofline forward (``latency.roofline_forward`` with the scenario
defaults), so the report says how far the hand-set efficiencies sit from this GPU.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specserve.sim.config import LatencyConfig
from specserve.sim.latency import roofline_forward
from specserve.sim.profiles import LinearFit, hardware_profiles, model_profiles

HOLD_OUT_EVERY = 4
# GPU names as torch reports them -> the simulator's hardware profile.
HARDWARE = {"NVIDIA H100 80GB HBM3": "h100", "NVIDIA H200": "h200"}


@dataclass(frozen=True, slots=True)
class Point:
    model: str
    batch: int
    query: int
    context: int
    seconds: float

    @property
    def num_context_tokens(self) -> int:
        return self.batch * self.context

    @property
    def num_batched_tokens(self) -> int:
        return self.batch * self.query


@dataclass(frozen=True, slots=True)
class ModelFit:
    hardware: str
    model: str
    fit: LinearFit
    num_points: int
    held_out_errors: tuple[float, ...]  # relative, signed: predicted / measured - 1
    roofline_errors: tuple[float, ...]

    @property
    def held_out_mape(self) -> float:
        return float(np.mean(np.abs(self.held_out_errors)))

    @property
    def held_out_max(self) -> float:
        return float(np.max(np.abs(self.held_out_errors)))

    @property
    def roofline_mape(self) -> float:
        return float(np.mean(np.abs(self.roofline_errors))) if self.roofline_errors else float("nan")


def load(paths: Iterable[Path]) -> tuple[dict[str, list[Point]], dict[str, list[dict]]]:
    """Forward points and k = 0 rows per hardware profile name."""
    forwards: dict[str, list[Point]] = defaultdict(list)
    k0: dict[str, list[dict]] = defaultdict(list)
    for path in paths:
        for line in Path(path).read_text().splitlines():
            row = json.loads(line)
            hardware = HARDWARE.get(row["gpu"])
            if hardware is None:
                raise ValueError(f"{path}: GPU {row['gpu']!r} has no hardware profile; known: {', '.join(HARDWARE)}")
            if row["kind"] == "forward":
                forwards[hardware].append(Point(row["model"], row["B"], row["q"], row["c"], row["ms"] / 1e3))
            else:
                k0[hardware].append(row)
    return dict(forwards), dict(k0)


def nonneg_lstsq(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least squares with every coefficient >= 0: drop the most negative column and refit."""
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(x[:, active] * w[:, None], y * w, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return coef


def fit_linear(points: Sequence[Point]) -> LinearFit:
    """Relative-error least squares for Eq. 3 with every coefficient >= 0."""
    x = np.array([[p.num_context_tokens, p.num_batched_tokens, 1.0] for p in points], dtype=float)
    y = np.array([p.seconds for p in points], dtype=float)
    coef = nonneg_lstsq(x, y, 1.0 / y)
    return LinearFit(s_per_context_token=coef[0], s_per_batched_token=coef[1], intercept_s=coef[2])


def predict(fit: LinearFit, point: Point) -> float:
    return (
        fit.s_per_context_token * point.num_context_tokens
        + fit.s_per_batched_token * point.num_batched_tokens
        + fit.intercept_s
    )


def fit_model(hardware: str, model: str, points: Sequence[Point]) -> ModelFit:
    held = [p for i, p in enumerate(points) if i % HOLD_OUT_EVERY == HOLD_OUT_EVERY - 1]
    kept = [p for i, p in enumerate(points) if i % HOLD_OUT_EVERY != HOLD_OUT_EVERY - 1]
    trial = fit_linear(kept)
    errors = tuple(predict(trial, p) / p.seconds - 1.0 for p in held)
    return ModelFit(hardware, model, fit_linear(points), len(points), errors, _roofline_errors(hardware, model, points))


def _roofline_errors(hardware: str, model: str, points: Sequence[Point]) -> tuple[float, ...]:
    profile = model_profiles().get(model)
    if profile is None:
        return ()
    cfg = LatencyConfig()
    forward = roofline_forward(
        profile,
        hardware_profiles()[hardware],
        1,
        cfg.bandwidth_efficiency,
        cfg.flops_efficiency,
        cfg.forward_overhead_s,
        cfg.layer_overhead_s,
    )
    return tuple(forward.forward_s(p.num_context_tokens, p.num_batched_tokens) / p.seconds - 1.0 for p in points)


def fit_all(forwards: dict[str, list[Point]]) -> list[ModelFit]:
    fits = []
    for hardware, points in sorted(forwards.items()):
        by_model: dict[str, list[Point]] = defaultdict(list)
        for p in points:
            by_model[p.model].append(p)
        fits += [fit_model(hardware, model, pts) for model, pts in by_model.items()]
    return fits
