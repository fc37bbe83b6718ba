"""Load shapes: who sends which request when.

Two kinds. A closed loop keeps N clients busy, each sending its next request when the last one finished,
so the offered load follows the server's speed. An open loop fixes arrival times in advance (Poisson,
piecewise-constant rates, gamma-bursty gaps, or a replayed trace), so the server's speed cannot slow the
arrivals down, which is what queueing and SLO studies need.

Gaps follow vLLM's ``vllm.benchmarks.serve.get_request``: gamma with shape ``burstiness`` and mean
``1 / rate`` (burstiness 1 is Poisson). Unlike vLLM, the times are not rescaled to hit the mean exactly,
since a piecewise schedule has no single target duration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specserve.sim.workload import clients_at, read_trace

# The simulator's traces, named by file stem as the scenarios name them (``traces/NAME.csv``).
TRACE_DIR = Path(__file__).resolve().parents[1] / "sim" / "scenarios" / "traces"


class BenchError(ValueError):
    """Bad user input; the message names the bad value (the CLI exits with status 2)."""


@dataclass(frozen=True, slots=True)
class Segment:
    duration_s: float
    rate_qps: float


@dataclass(frozen=True, slots=True)
class Phase:
    """A stretch of a closed loop whose client count changes (``--clients``)."""

    clients: int
    duration_s: float


@dataclass(frozen=True, slots=True)
class Plan:
    """What to send. ``arrival_s`` is None for a closed loop (``concurrency`` clients instead).

    Lengths are per request; a closed loop with only a duration has no count in advance, so it cycles
    through them (fixed lengths are one entry each).
    """

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    arrival_s: np.ndarray | None = None
    concurrency: int = 0
    num_requests: int | None = None  # closed loop: stop after this many
    duration_s: float | None = None  # closed loop: send nothing new after this
    phases: tuple[Phase, ...] = ()  # closed loop whose clients change; ``concurrency`` is then their most

    @property
    def window_s(self) -> float | None:
        """A closed loop's sending window, over which its steady rate is taken (``report.window``)."""
        return self.duration_s if self.arrival_s is None else None

    def clients_at(self, t_s: float) -> tuple[int, float]:
        """A closed loop's client count at ``t_s`` seconds into the run, and when it next changes (the simulator's
        closed loop follows the same schedule)."""
        return clients_at(self.phases, t_s) if self.phases else (self.concurrency, math.inf)

    def lengths(self, index: int) -> tuple[int, int]:
        i = index % len(self.prompt_tokens)
        return int(self.prompt_tokens[i]), int(self.output_tokens[i])


def parse_rate(text: str) -> list[Segment]:
    """``QPS`` (one open-ended segment) or ``QPS:SECONDS,QPS:SECONDS,...`` (piecewise)."""
    segments = []
    for part in text.split(","):
        rate_text, _, duration_text = part.partition(":")
        try:
            rate = float(rate_text)
            duration = float(duration_text) if duration_text else math.inf
        except ValueError:
            raise BenchError(f"--rate {text!r}: {part!r} is not QPS or QPS:SECONDS") from None
        if not rate >= 0 or not duration > 0 or math.isnan(duration):
            raise BenchError(f"--rate {text!r}: rate must be >= 0 and duration > 0 in {part!r}")
        segments.append(Segment(duration, rate))
    if any(math.isinf(s.duration_s) for s in segments[:-1]):
        raise BenchError(f"--rate {text!r}: only the last segment may omit its duration")
    if not any(s.rate_qps > 0 for s in segments):
        raise BenchError(f"--rate {text!r}: no segment has a positive rate")
    if math.isinf(segments[-1].duration_s) and segments[-1].rate_qps == 0:
        raise BenchError(f"--rate {text!r}: an open-ended last segment needs a positive rate")
    return segments


def parse_clients(text: str) -> list[Phase]:
    """``N:SECONDS,N:SECONDS,...``: a closed loop of N clients for SECONDS, then the next count."""
    phases = []
    for part in text.split(","):
        clients_text, colon, duration_text = part.partition(":")
        try:
            clients, duration = int(clients_text), float(duration_text)
        except ValueError:
            raise BenchError(f"--clients {text!r}: {part!r} is not N:SECONDS") from None
        if not colon or clients < 0 or not 0 < duration < math.inf:
            raise BenchError(f"--clients {text!r}: need clients >= 0 and 0 < seconds < inf in {part!r}")
        phases.append(Phase(clients, duration))
    if not any(p.clients > 0 for p in phases):
        raise BenchError(f"--clients {text!r}: no phase has a client")
    return phases


def arrivals(
    segments: list[Segment],
    rng: np.random.Generator,
    burstiness: float = 1.0,
    num_requests: int | None = None,
    duration_s: float | None = None,
) -> np.ndarray:
    """Arrival times of a renewal process whose rate is constant within each segment.

    Stops at ``num_requests`` arrivals, at ``duration_s``, or at the schedule's end, whichever is first.
    A gap that crosses a segment's end restarts at the next segment (exact for Poisson, which is memoryless).
    """
    end_s = min(duration_s if duration_s is not None else math.inf, sum(s.duration_s for s in segments))
    if math.isinf(end_s) and num_requests is None:
        raise BenchError("an open-ended --rate needs --duration or --num-requests")
    limit = num_requests if num_requests is not None else math.inf
    times: list[float] = []
    start_s = 0.0
    for seg in segments:
        seg_end = start_s + seg.duration_s
        t = start_s
        while seg.rate_qps > 0 and len(times) < limit:
            t += rng.gamma(shape=burstiness, scale=1.0 / (seg.rate_qps * burstiness))
            if t >= seg_end or t >= end_s:
                break
            times.append(t)
        start_s = seg_end
        if len(times) >= limit or start_s >= end_s:
            break
    return np.array(times, dtype=np.float64)


def trace_path(ref: str) -> Path:
    """A built-in trace name (a CSV stem under the simulator's traces) or a CSV path."""
    builtins = {p.stem: p for p in sorted(TRACE_DIR.glob("*.csv"))}
    path = builtins.get(ref) or Path(ref)
    if not path.is_file():
        raise BenchError(f"unknown trace {ref!r}: not a built-in ({', '.join(builtins)}) nor a CSV file")
    return path


def trace_plan(ref: str, speed: float, num_requests: int | None, duration_s: float | None) -> Plan:
    """Replays a trace: arrival times (divided by ``speed``), prompt and output lengths as recorded."""
    from specserve.sim.profiles import ProfileError

    try:
        workload = read_trace(trace_path(ref))
    except ProfileError as exc:
        raise BenchError(str(exc)) from None
    arrival = workload.arrival_s / speed
    keep = np.ones(len(arrival), dtype=bool) if duration_s is None else arrival < duration_s
    if num_requests is not None:
        keep[num_requests:] = False
    if not keep.any():
        raise BenchError(f"trace {ref!r}: no request arrives within the given --duration/--num-requests")
    return Plan(workload.prompt_tokens[keep], workload.output_tokens[keep], arrival_s=arrival[keep])


# Lengths a closed loop run for a duration cycles through when they vary: more than any run here sends.
CYCLE = 4096


@dataclass(frozen=True, slots=True)
class Lengths:
    """Prompt and output lengths: each uniform on [L (1 - R), L (1 + R)], as vLLM's random dataset draws them
    (``--random-range-ratio``); R = 0 gives every request the same. Equal lengths keep a closed loop's
    clients in lockstep: with ``ignore_eos`` and one step per token they all finish on one step and send their
    next prompts at once, so every wave opens with a prefill burst that no real workload has."""

    input_len: int
    output_len: int
    range_ratio: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.range_ratio < 1.0:
            raise BenchError(f"--range-ratio {self.range_ratio:g}: must be at least 0 and below 1")

    def draw(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if self.range_ratio == 0.0:
            return np.full(n, self.input_len, dtype=np.int64), np.full(n, self.output_len, dtype=np.int64)
        # Its own stream: varying the lengths leaves an open loop's arrival times as they were.
        rng = np.random.default_rng([self.seed, 1])
        return self._uniform(rng, n, self.input_len), self._uniform(rng, n, self.output_len)

    def _uniform(self, rng: np.random.Generator, n: int, mean: int) -> np.ndarray:
        low = max(1, int(np.floor(mean * (1.0 - self.range_ratio))))
        high = max(low, int(np.ceil(mean * (1.0 + self.range_ratio))))
        return rng.integers(low, high + 1, size=n, dtype=np.int64)


def closed_plan(concurrency: int, lengths: Lengths, num_requests: int | None, duration_s: float | None) -> Plan:
    if num_requests is None and duration_s is None:
        raise BenchError("--concurrency needs --num-requests or --duration")
    n = 1 if lengths.range_ratio == 0.0 else num_requests or CYCLE
    return Plan(*lengths.draw(n), concurrency=concurrency, num_requests=num_requests, duration_s=duration_s)


def schedule_plan(phases: list[Phase], lengths: Lengths) -> Plan:
    """A closed loop whose client count follows ``phases``. Client i sends while the count is above i; when the
    count drops, the clients above it finish the request they have in flight and sit out, as users who leave."""
    n = 1 if lengths.range_ratio == 0.0 else CYCLE
    most = max(p.clients for p in phases)
    total_s = sum(p.duration_s for p in phases)
    return Plan(*lengths.draw(n), concurrency=most, duration_s=total_s, phases=tuple(phases))


def open_plan(segments: list[Segment], burstiness: float, lengths: Lengths, seed: int, **stop) -> Plan:
    times = arrivals(segments, np.random.default_rng(seed), burstiness, **stop)
    if len(times) == 0:
        raise BenchError("the --rate schedule yields no request within the given --duration/--num-requests")
    return Plan(*lengths.draw(len(times)), arrival_s=times)
