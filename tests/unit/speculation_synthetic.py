"""Synthetic step records for the policy tests: a known linear step latency and i.i.d. acceptance, or a
GPU-like step cost that bends at the ridge point."""

from __future__ import annotations

import random
from collections.abc import Sequence

from specserve.speculation.types import StepRecord


def draw_accepted(rng: random.Random, alpha: float, num_drafted: int) -> int:
    """Accepted prefix length when each draft passes independently with probability alpha."""
    num_accepted = 0
    while num_accepted < num_drafted and rng.random() < alpha:
        num_accepted += 1
    return num_accepted


def true_step_s(
    coefficients: Sequence[float],
    num_context_tokens: int,
    num_batched_tokens: int,
    num_draft_passes: int,
    num_running: int,
) -> float:
    """The ground-truth latency the tests generate durations from (the model's own functional form)."""
    c0, c1, c2, c3, c4 = coefficients
    return (
        c0
        + c1 * num_context_tokens
        + c2 * num_batched_tokens
        + c3 * num_draft_passes
        + c4 * num_draft_passes * num_running
    )


def make_record(
    rng: random.Random,
    coefficients: Sequence[float],
    *,
    now_s: float,
    k: int,
    num_running: int,
    alpha: float,
    num_context_tokens: int,
    num_prefill_tokens: int = 0,
    k0_runs_draft_pass: bool = True,
) -> StepRecord:
    """One step of num_running requests each drafting k tokens, timed by the true latency."""
    accepted = tuple(draw_accepted(rng, alpha, k) for _ in range(num_running)) if k > 0 else ()
    drafted = (k,) * len(accepted)
    num_batched_tokens = num_running * (k + 1) + num_prefill_tokens
    num_draft_passes = k if k > 0 else int(k0_runs_draft_pass)
    return StepRecord(
        now_s=now_s,
        k=k,
        duration_s=true_step_s(coefficients, num_context_tokens, num_batched_tokens, num_draft_passes, num_running),
        num_running=num_running,
        num_context_tokens=num_context_tokens,
        num_batched_tokens=num_batched_tokens,
        num_draft_passes=num_draft_passes,
        num_emitted_tokens=sum(accepted) + num_running,
        num_drafted_per_request=drafted,
        num_accepted_per_request=accepted,
    )


def varied_records(
    seed: int, coefficients: Sequence[float], alpha: float, max_k: int, num_steps: int
) -> list[StepRecord]:
    """Steps whose k, batch size, context and prefill all vary, so every coefficient is identifiable."""
    rng = random.Random(seed)
    records = []
    for step in range(num_steps):
        num_running = rng.choice((1, 2, 4, 8, 16, 32, 64, 128, 256))
        records.append(
            make_record(
                rng,
                coefficients,
                now_s=step * 0.01,
                k=rng.randint(0, max_k),
                num_running=num_running,
                alpha=alpha,
                num_context_tokens=num_running * rng.randint(50, 2000),
                num_prefill_tokens=rng.choice((0, 0, 0, 128, 512)),
            )
        )
    return records


def roofline_s(num_batched: int, num_passes: int, num_running: int) -> float:
    """A GPU-like step: memory-bound (20 ms) up to 200 tokens, then 100 us per token; 0.5 ms per draft pass."""
    return 0.002 + max(0.020, 1e-4 * num_batched) + num_passes * (5e-4 + 1e-6 * num_running)


def roofline_record(
    num_batched: int, num_passes: int, num_running: int, k: int = 0, duration_s: float | None = None
) -> StepRecord:
    duration = roofline_s(num_batched, num_passes, num_running) if duration_s is None else duration_s
    return StepRecord(
        now_s=0.0,
        k=k,
        duration_s=duration,
        num_running=num_running,
        num_context_tokens=0,
        num_batched_tokens=num_batched,
        num_draft_passes=num_passes,
        num_emitted_tokens=num_running,
    )


def kinked_steps(n: int = 3000, seed: int = 0) -> list[StepRecord]:
    """Steps of random batch, k and prefill chunk, timed by ``roofline_s``."""
    rng = random.Random(seed)
    steps = []
    for _ in range(n):
        batch, k = rng.randint(1, 256), rng.randint(0, 4)
        prefill = rng.choice([0, 0, 0, rng.randint(1, 4096)])
        steps.append(roofline_record(prefill + batch * (k + 1), max(k, 1), batch, k))
    return steps
