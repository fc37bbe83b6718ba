"""A policy's decisions replayed from an engine's step log (``specserve.speculation.step_log``).

Each run (consecutive steps of one engine under one policy spec) is replayed through a fresh policy of that
spec, warm-started as the engine warm-starts a policy it is switched to (``Policy.warm_start`` on the steps
before, up to ``warm_steps``): the logged contexts go in, the logged records are observed. A policy that learns
only from what it observes then chooses exactly the k the engine ran, and what it predicted for every other k
can be read beside what the engine measured. That answers why a policy chose as it did on a real engine, which
its counters alone cannot.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specserve.speculation import make_policy, step_log
from specserve.speculation.policy import Policy
from specserve.speculation.step_log import LoggedStep


@dataclass(slots=True)
class BatchRow:
    """Steps of one run at one decode batch size: the k the engine ran and what the policy predicted."""

    steps: int = 0
    engine_k: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    # Per k = 0..max_k, summed over the steps (divide by ``steps``): seconds the policy charged the decodes,
    # and its predicted goodput in tokens per second.
    predicted_s: np.ndarray | None = None
    predicted_goodput: np.ndarray | None = None
    # Per k the engine ran: (steps, summed duration seconds, summed tokens per request).
    measured: dict[int, list[float]] = field(default_factory=dict)


@dataclass(slots=True)
class RunReplay:
    engine: str
    policy: str
    num_steps: int
    num_agreeing: int  # steps whose replayed k is the engine's
    by_batch: dict[int, BatchRow]
    description: dict[str, float]  # the replayed policy's ``describe()`` at the end of the run


def load_log_arg(parser: argparse.ArgumentParser, path: Path) -> list[LoggedStep]:
    """``step_log.load`` for a bench script's log argument: a missing or bad file is the parser's error."""
    try:
        return step_log.load(path)
    except ValueError as exc:
        parser.error(f"log: {exc}")


def runs(steps: Sequence[LoggedStep], policy: str = "") -> list[tuple[int, int]]:
    """(start, stop) index ranges of consecutive steps of one engine under one policy (a spec starting with
    ``policy``)."""
    out: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(steps) + 1):
        if i == len(steps) or (steps[i].engine, steps[i].policy) != (steps[start].engine, steps[start].policy):
            if steps[start].policy.startswith(policy):
                out.append((start, i))
            start = i
    return out


def warm_policy(steps: Sequence[LoggedStep], start: int, warm_steps: int = 1024) -> Policy:
    """A fresh policy of ``steps[start]``'s spec, warm-started on that engine's earlier steps as the engine did."""
    first = steps[start]
    policy = make_policy(first.policy, first.traits)
    earlier = [s.record for s in steps[:start] if s.engine == first.engine]
    policy.warm_start(earlier[-warm_steps:] if warm_steps else [])
    return policy


def replay_run(steps: Sequence[LoggedStep], start: int, stop: int, warm_steps: int = 1024) -> RunReplay:
    """Replay ``steps[start:stop]``, warm-started on that engine's earlier steps as the engine did."""
    first = steps[start]
    policy = warm_policy(steps, start, warm_steps)
    priced = hasattr(policy, "decode_seconds_all") and hasattr(policy, "core")
    by_batch: dict[int, BatchRow] = defaultdict(BatchRow)
    agreeing = 0
    for logged in steps[start:stop]:
        ctx, record = logged.ctx, logged.record
        if priced and ctx.num_running > 0 and ctx.draft_resident:
            seconds = np.maximum(policy.decode_seconds_all(ctx), 1e-9)  # type: ignore[attr-defined]
            goodputs = np.array(policy.core.goodputs(ctx.num_running, seconds.tolist()))  # type: ignore[attr-defined]
            row = by_batch[ctx.num_running]
            row.predicted_s = seconds if row.predicted_s is None else row.predicted_s + seconds
            row.predicted_goodput = goodputs if row.predicted_goodput is None else row.predicted_goodput + goodputs
        k = max(0, min(policy.choose(ctx).k, first.traits.max_k)) if ctx.draft_resident else 0
        agreeing += k == record.k
        if ctx.num_running > 0:
            row = by_batch[ctx.num_running]
            row.steps += 1
            row.engine_k[record.k] += 1
            m = row.measured.setdefault(record.k, [0, 0.0, 0.0])
            m[0] += 1
            m[1] += record.duration_s
            m[2] += record.num_emitted_tokens / max(record.num_running, 1)
        policy.observe(record)
    return RunReplay(
        first.engine, first.policy, stop - start, agreeing, dict(sorted(by_batch.items())), policy.describe()
    )


def format_run(run: RunReplay) -> str:
    lines = [
        f"{run.policy} on engine {run.engine}: {run.num_steps} steps, replayed k = engine's k on "
        f"{run.num_agreeing} ({run.num_agreeing / max(run.num_steps, 1):.0%})"
    ]
    for batch, row in run.by_batch.items():
        ks = " ".join(f"k{k}:{n}" for k, n in sorted(row.engine_k.items()))
        lines.append(f"  batch {batch:>3}: {row.steps} steps, engine ran {ks}")
        if row.predicted_s is not None and row.predicted_goodput is not None:
            n = row.steps
            ms = " ".join(f"{1e3 * v / n:6.1f}" for v in row.predicted_s)
            best = row.predicted_goodput.max()
            gp = " ".join(f"{v / best:6.3f}" for v in row.predicted_goodput)
            lines.append(f"    predicted ms per k     {ms}")
            lines.append(f"    predicted goodput ÷ max {gp}")
        for k, (count, seconds, tokens) in sorted(row.measured.items()):
            lines.append(
                f"    measured k={k}: {1e3 * seconds / count:6.1f} ms, {tokens / count:.2f} tokens per request, "
                f"{batch * tokens / seconds:6.1f} tok/s ({int(count)} steps)"
            )
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class PriceRow:
    """How a priced policy valued each k at one logged step, split into the parts that make its price."""

    step: int  # index within the run
    k: int  # the k the engine ran
    model_ms: tuple[float, ...]  # per k: the step-cost fit's milliseconds, before the bucket correction
    factors: tuple[float, ...]  # per k: the bucket correction's factor (``estimators.bucket_correction``)
    alphas: tuple[float, ...]  # per draft position: the acceptance estimate


def trace_prices(
    steps: Sequence[LoggedStep], start: int, stop: int, batch: int, every: int = 60, warm_steps: int = 1024
) -> list[PriceRow]:
    """Every ``every``-th decode-only step at ``batch`` requests of a replayed run: the fit's price per k, the
    correction's factor per k and the acceptance per position, which together set the goodputs it compared. A
    policy without a step-cost fit and a correction (only ``adaptive`` has both) cannot be traced."""
    if every < 1:
        raise ValueError(f"every={every} must be at least 1")
    policy = warm_policy(steps, start, warm_steps)
    if not all(hasattr(policy, name) for name in ("decode_seconds_all", "correction", "core")):
        raise ValueError(f"policy {steps[start].policy!r} has no step-cost fit and correction to trace")
    rows: list[PriceRow] = []
    seen = 0
    for index, logged in enumerate(steps[start:stop]):
        ctx = logged.ctx
        if ctx.num_running == batch and ctx.num_prefill_tokens == 0 and ctx.draft_resident:
            if seen % every == 0:
                num_k = policy.max_k + 1  # type: ignore[attr-defined]
                factors = np.array(policy.correction.factors(batch, num_k))  # type: ignore[attr-defined]
                # Without a prefill the decodes are charged the whole step: the fit's seconds times the factor.
                charged = np.asarray(policy.decode_seconds_all(ctx))  # type: ignore[attr-defined]
                rows.append(
                    PriceRow(
                        index,
                        logged.record.k,
                        tuple(float(v) for v in 1e3 * charged / factors),
                        tuple(float(f) for f in factors),
                        tuple(float(a) for a in policy.core.acceptance.alphas()),  # type: ignore[attr-defined]
                    )
                )
            seen += 1
        if ctx.draft_resident:
            policy.choose(ctx)
        policy.observe(logged.record)
    return rows


def format_prices(batch: int, rows: Sequence[PriceRow]) -> str:
    lines = [f"  prices at batch {batch}: step, k run | fit ms per k | correction per k | acceptance per position"]
    for row in rows:
        lines.append(
            f"    {row.step:>5} k{row.k} | {' '.join(f'{v:5.1f}' for v in row.model_ms)} | "
            f"{' '.join(f'{f:5.3f}' for f in row.factors)} | {' '.join(f'{a:5.3f}' for a in row.alphas)}"
        )
    return "\n".join(lines)
