"""The roofline step timer against every step time the papers report (papers/step_times.yaml).

Each point names a GPU, a target (and draft), TP, batch, context per request and k. It is priced with
``latency.roofline_timer`` on a ``LatencyConfig`` with the scenario defaults, the very timer a roofline scenario
runs on (scenario.resolve), with the engine's pass structure (sim.replica.Replica._price): one target pass over
B * (k + 1) tokens reading B * context cached tokens, then k draft passes of B tokens each reading the same
context. Quantities: ``step_s`` (seconds), ``draft_share`` (draft passes / step) and ``step_ratio`` (step at k
over step at k_ref). A fractional k is a mean over steps, so the time is interpolated between floor and ceil.

Error is |ln(predicted / measured)|, reported as median and max over the absolute points (seconds) and over
the shape points (shares and ratios) separately. ``BEFORE`` is the model as it was before this check: no
per-layer cost (config.LatencyConfig ``layer_overhead_s`` and ``eager_layer_overhead_s`` at 0). What the
comparison showed and what changed is in bench/results/latency-check.md (``latency_report.py`` writes it).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from lab.experiments.papers import STEP_TIMES_FILE, PaperData, PaperPoint, load_yaml
from specserve.sim.config import LatencyConfig
from specserve.sim.latency import StepTimer, roofline_timer
from specserve.sim.profiles import lookup
from specserve.speculation.estimators.slo_efficiency import batch_expansion_context

# The model before the per-layer cost: same defaults otherwise.
BEFORE = LatencyConfig(layer_overhead_s=0.0, eager_layer_overhead_s=0.0)
ABSOLUTE = "step_s"


@dataclass(frozen=True, slots=True)
class Row:
    point: PaperPoint
    predicted: float
    # The model before this check's change, for the before/after comparison.
    predicted_before: float
    # What-if: the target verifies with V0's batch-expansion scorer (see _step_parts).
    predicted_batch_expansion: float

    @property
    def ratio(self) -> float:
        return self.predicted / self.point.measured

    @property
    def log_error(self) -> float:
        return abs(math.log(self.ratio))

    @property
    def log_error_before(self) -> float:
        return abs(math.log(self.predicted_before / self.point.measured))


@dataclass(frozen=True, slots=True)
class ErrorStats:
    num_points: int
    median_log_error: float
    max_log_error: float


@cache
def load_points(path: Path = STEP_TIMES_FILE) -> PaperData:
    return load_yaml(path, PaperData)


def timer_for(point: PaperPoint, cfg: LatencyConfig) -> StepTimer:
    """The scenario's roofline timer for the point's GPU, models and TP, in the point's engine mode."""
    target = lookup("model", point.target)
    # With no draft the draft forward is never priced (no draft pass), so the target stands in for it.
    draft = lookup("model", point.draft) if point.draft else target
    mode = cfg.model_copy(update={"cuda_graphs": point.cuda_graphs})
    return roofline_timer(mode, lookup("hardware", point.hardware), target, draft, point.tp)


def _step_parts(timer: StepTimer, point: PaperPoint, k: int, batch_expansion: bool) -> tuple[float, float]:
    """(step seconds, of which draft passes) at integer k, as sim.replica.Replica._price prices a decode step.

    ``batch_expansion``: a what-if for vLLM V0's batch-expansion scorer, which verifies position j of each
    request as its own sequence with context + j cached tokens, so the target reads every request's KV k + 1
    times (AdaSpec §4.1, Eq. 4): the engine's ``scorer: batch_expansion`` (sim/replica.py prices each
    request's own context; here every request holds the point's context).
    """
    b = point.batch_size
    context = b * point.context_tokens
    # A speculative engine runs one draft pass even at k = 0 (EngineConfig.k0_runs_draft_pass default).
    num_passes = 0 if point.draft is None else max(k, 1)
    passes = [b] * num_passes
    expanded = batch_expansion_context(context, b, k) if batch_expansion else None
    step_s = timer.step_s(context, b * (k + 1), passes, expanded, verifies=k > 0 and point.draft is not None)
    draft_s = sum(timer.draft.forward_s(context, tokens) for tokens in passes)
    return step_s, draft_s


def _at(timer: StepTimer, point: PaperPoint, k: float, batch_expansion: bool) -> tuple[float, float]:
    low, high = math.floor(k), math.ceil(k)
    lo, hi = _step_parts(timer, point, low, batch_expansion), _step_parts(timer, point, high, batch_expansion)
    w = k - low
    return (1 - w) * lo[0] + w * hi[0], (1 - w) * lo[1] + w * hi[1]


def predict(point: PaperPoint, cfg: LatencyConfig | None = None, batch_expansion: bool = False) -> float:
    """The model's value of the point's quantity under ``cfg`` (default: the scenario defaults)."""
    timer = timer_for(point, cfg or LatencyConfig())
    step_s, draft_s = _at(timer, point, point.k, batch_expansion)
    if point.quantity == "step_s":
        return step_s
    if point.quantity == "draft_share":
        return draft_s / step_s
    if point.k_ref is None:
        raise ValueError(f"point {point.id!r}: step_ratio needs k_ref")
    return step_s / _at(timer, point, point.k_ref, batch_expansion)[0]


def check(cfg: LatencyConfig | None = None, data: PaperData | None = None) -> list[Row]:
    """One row per point: the model under ``cfg`` (default: scenario defaults) and the model before."""
    data = data or load_points()
    return [Row(p, predict(p, cfg), predict(p, BEFORE), predict(p, cfg, batch_expansion=True)) for p in data.points]


def error_stats(rows: list[Row], absolute: bool = True, before: bool = False) -> ErrorStats:
    """Median and max |ln(predicted / measured)| over the absolute (seconds) or the shape points."""
    chosen = [r for r in rows if (r.point.quantity == ABSOLUTE) == absolute]
    errors = [r.log_error_before if before else r.log_error for r in chosen]
    if not errors:
        return ErrorStats(0, 0.0, 0.0)
    return ErrorStats(len(errors), statistics.median(errors), max(errors))


def as_json(rows: list[Row]) -> dict:
    """One JSON document: every row, and the error before and after on both kinds of point."""
    stats = {
        f"{kind}_{when}": vars_of(error_stats(rows, kind == "absolute", when == "before"))
        for kind in ("absolute", "shape")
        for when in ("before", "after")
    }
    return {
        "data_file": str(STEP_TIMES_FILE),
        "error": stats,
        "rows": [
            {
                **r.point.model_dump(),
                "predicted": r.predicted,
                "predicted_before": r.predicted_before,
                "predicted_batch_expansion": r.predicted_batch_expansion,
                "ratio": r.ratio,
                "log_error": r.log_error,
            }
            for r in rows
        ],
    }


def vars_of(stats: ErrorStats) -> dict:
    return {
        "num_points": stats.num_points,
        "median_log_error": stats.median_log_error,
        "max_log_error": stats.max_log_error,
    }
