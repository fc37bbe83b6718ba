"""Request streams: arrival times and prompt/output lengths, drawn once per run from its seeded RNG.

Every bursty shape (Nightjar Appendix C) is a piecewise-constant Poisson rate, so one generator serves
them all; a trace replays a CSV as is.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from specserve.sim.config import (
    BurstArrivals,
    ClientsArrivals,
    MultiPeakArrivals,
    OscillationArrivals,
    PiecewiseArrivals,
    PoissonArrivals,
    RateSegment,
    StreamConfig,
    TraceArrivals,
    WorkloadConfig,
)
from specserve.sim.profiles import LengthDistribution, ProfileError, lookup


@dataclass(frozen=True, slots=True)
class Workload:
    """Aligned per-request arrays, sorted by arrival."""

    arrival_s: np.ndarray  # float64 seconds from the start of the run
    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64, at least 1
    # bool: the client marked the request as batch work (workload.batch); None: every request is latency-sensitive.
    batch: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.arrival_s)

    def is_batch(self) -> np.ndarray:
        return self.batch if self.batch is not None else np.zeros(len(self), dtype=bool)


class _Phase(Protocol):
    @property
    def clients(self) -> int: ...

    @property
    def duration_s(self) -> float: ...


def clients_at(phases: Sequence[_Phase], t_s: float) -> tuple[int, float]:
    """A closed loop's client count at ``t_s`` seconds into the run, and when it next changes (0 after the end)."""
    end_s = 0.0
    for phase in phases:
        end_s += phase.duration_s
        if t_s < end_s:
            return phase.clients, end_s
    return 0, math.inf


def rate_segments(arrivals: object) -> list[RateSegment]:
    """The piecewise-constant rate of any generated arrival shape."""
    if isinstance(arrivals, PoissonArrivals):
        return [RateSegment(duration_s=arrivals.duration_s, rate_qps=arrivals.rate_qps)]
    if isinstance(arrivals, PiecewiseArrivals):
        return list(arrivals.segments)
    if isinstance(arrivals, BurstArrivals):
        return _peaks(
            arrivals.base_qps,
            arrivals.peak_qps,
            [arrivals.burst_start_s],
            arrivals.burst_duration_s,
            arrivals.duration_s,
        )
    if isinstance(arrivals, MultiPeakArrivals):
        return _peaks(
            arrivals.base_qps, arrivals.peak_qps, arrivals.peak_starts_s, arrivals.peak_duration_s, arrivals.duration_s
        )
    if isinstance(arrivals, OscillationArrivals):
        half_s, segments, t = arrivals.period_s / 2, [], 0.0
        while t < arrivals.duration_s:
            rate = arrivals.high_qps if int(round(t / half_s)) % 2 == 0 else arrivals.low_qps
            segments.append(RateSegment(duration_s=min(half_s, arrivals.duration_s - t), rate_qps=rate))
            t += half_s
        return segments
    raise TypeError(f"no rate for {type(arrivals).__name__}")


def _peaks(base: float, peak: float, starts: list[float], length_s: float, duration_s: float) -> list[RateSegment]:
    segments, t = [], 0.0
    for start in sorted(starts):
        start, end = min(max(start, t), duration_s), min(start + length_s, duration_s)
        if start > t:
            segments.append(RateSegment(duration_s=start - t, rate_qps=base))
        if end > start:
            segments.append(RateSegment(duration_s=end - start, rate_qps=peak))
        t = max(t, end)
    if duration_s > t:
        segments.append(RateSegment(duration_s=duration_s - t, rate_qps=base))
    return segments


def poisson_arrivals(segments: list[RateSegment], rng: np.random.Generator) -> np.ndarray:
    """Arrival times of a Poisson process whose rate is constant within each segment."""
    times, start_s = [], 0.0
    for seg in segments:
        count = int(rng.poisson(seg.rate_qps * seg.duration_s))
        # Given the count, Poisson arrivals in a window are uniform order statistics.
        times.append(np.sort(start_s + rng.random(count) * seg.duration_s))
        start_s += seg.duration_s
    return np.concatenate(times) if times else np.zeros(0)


def sample_lengths(dist: LengthDistribution, count: int, rng: np.random.Generator) -> np.ndarray:
    """Lognormal with the given mean and std (moment-matched), rounded and clipped."""
    if dist.std == 0:
        values = np.full(count, dist.mean)
    else:
        sigma2 = np.log1p((dist.std / dist.mean) ** 2)
        values = rng.lognormal(np.log(dist.mean) - sigma2 / 2, np.sqrt(sigma2), count)
    return np.clip(np.rint(values), dist.min_tokens, dist.max_tokens).astype(np.int64)


def read_trace(path: Path) -> Workload:
    try:
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        arrival = np.array([float(r["arrival_s"]) for r in rows])
        prompt = np.array([int(r["prompt_tokens"]) for r in rows], dtype=np.int64)
        output = np.array([int(r["output_tokens"]) for r in rows], dtype=np.int64)
    except (OSError, KeyError, ValueError) as exc:
        raise ProfileError(f"trace {path}: {exc!r} (need columns arrival_s, prompt_tokens, output_tokens)") from None
    order = np.argsort(arrival, kind="stable")
    return Workload(arrival[order], np.maximum(prompt[order], 1), np.maximum(output[order], 1))


def build_workload(cfg: WorkloadConfig, base_dir: Path, max_model_len: int, rng: np.random.Generator) -> Workload:
    workload = _stream(cfg, base_dir, rng)
    # The batch stream draws after the first, so a scenario without one draws exactly what it always did.
    if cfg.batch is not None:
        workload = _merge(workload, _stream(cfg.batch, base_dir, rng))
    return fit_context(workload, max_model_len)


def fit_context(workload: Workload, max_model_len: int) -> Workload:
    """Every request must fit the model's context: prompt first, then as much output as is left."""
    prompt = np.minimum(workload.prompt_tokens, max_model_len - 1)
    output = np.clip(workload.output_tokens, 1, max_model_len - prompt)
    return Workload(workload.arrival_s, prompt, output, workload.batch)


def _stream(cfg: StreamConfig, base_dir: Path, rng: np.random.Generator) -> Workload:
    if isinstance(cfg.arrivals, ClientsArrivals):
        raise TypeError("a closed loop's requests are drawn as its clients send them (feeds.ClosedLoop)")
    if isinstance(cfg.arrivals, TraceArrivals):
        path = Path(cfg.arrivals.path)
        return read_trace(path if path.is_absolute() else base_dir / path)
    arrival = poisson_arrivals(rate_segments(cfg.arrivals), rng)
    return Workload(arrival, *draw_lengths(cfg, len(arrival), rng))


def draw_lengths(cfg: StreamConfig, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output lengths of ``count`` requests from the stream's dataset or inline lengths."""
    lengths = cfg.lengths or lookup("dataset", cfg.dataset)
    return sample_lengths(lengths.prompt_tokens, count, rng), sample_lengths(lengths.output_tokens, count, rng)


def _merge(interactive: Workload, batch: Workload) -> Workload:
    """One stream sorted by arrival (ties: the interactive request first), each request keeping its class."""
    order = np.argsort(np.concatenate((interactive.arrival_s, batch.arrival_s)), kind="stable")
    flags = np.concatenate((np.zeros(len(interactive), dtype=bool), np.ones(len(batch), dtype=bool)))
    return Workload(
        np.concatenate((interactive.arrival_s, batch.arrival_s))[order],
        np.concatenate((interactive.prompt_tokens, batch.prompt_tokens))[order],
        np.concatenate((interactive.output_tokens, batch.output_tokens))[order],
        flags[order],
    )
