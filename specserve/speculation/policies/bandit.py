"""Nightjar's planner: per batch-size context, ADA-BINGREEDY over k with a switching-cost term.

Nightjar §5.1-5.2 (Eqs. 1 and 4, Algorithm 1, Table 3); where the paper's prose leaves a formula open we follow
the authors' released planner. Each step with B running requests:

1. b = bucket(B) (below); only steps with batch context b advance b's block/bin/round counters (§5.2, Fig. 6).
2. At the first round of a bin, draw its type: exploration with probability p_i (``parts.bingreedy``).
   Exploration locks k uniform over 0..max_k; exploitation locks Eq. (4),

       k = argmin_k  lbar[b, k] + 1[k_prev = 0 and k > 0] * C_sw(L_eff, B) / k,

   lbar being the running mean latency per token of arm k in context b, and C_sw the cost of the draft
   re-prefilling the L_eff tokens it skipped while speculation was off (``parts.switching``, Table 3; on
   an engine that measured its own catch-up, ``EngineTraits.resume_s_per_token`` x (L_eff - 1) x B).
3. Every round of the bin plays the locked k (bin-level locking bounds the switches, Nightjar §5.3).

Choices where the paper is open, each documented at its use: the bucket (log2 by default, the
authors' code; the paper's exact B is ``bucketing=exact``), p_i (i^-1/2), unvisited arms (never
exploited, exploration fills them), ties (smaller k), latency per token per request (the authors' code's
reward; it puts l and C_sw in the same unit), k_prev (the engine-wide previous k: the draft's KV lag is the
engine's, not a batch size's), L_eff (estimated from records, below), and no epoch restart (the paper
describes no drift test).
The re-enable step's own duration, catch-up prefill included, is kept in lbar as measured: the paper
observes "the realized goodput", and records do not say how much of a step was catch-up.

L_eff, the largest draft lag in the batch, is estimated from the records (``parts.switching.DraftLag``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from specserve.speculation.policies.parts.bingreedy import EXPLORE_SCHEDULES, BinSchedule, explore_probability
from specserve.speculation.policies.parts.switching import (
    DEFAULT_SWITCH_COST_TABLE,
    DraftLag,
    SwitchCostTable,
    measured_resume_s,
)
from specserve.speculation.policies.parts.ties import argmin_smallest
from specserve.speculation.policy import Policy, largest_k, register
from specserve.speculation.types import Decision, EngineTraits, StepContext, StepRecord

BUCKETINGS = ("log2", "exact")


@dataclass(frozen=True, slots=True)
class BanditParams:
    # K_max; the arms are 0..min(max_k, engine max_k) (None: the engine's). The paper never states it; the authors'
    # scripts use 3, 4 or 5, and the reproductions run 4.
    max_k: int | None = 4
    # Seeds the bin-type draws and the exploration arms; the same seed replays the same k sequence.
    seed: int = 0
    # p_i: "inv_sqrt" = i^-1/2 (authors' code, Appendix A.4's reading) or "inv" = 1/i.
    explore_schedule: str = "inv_sqrt"
    # "log2": B=1 -> 0, B=2 -> 1, else ceil(log2 B), so 3-4 -> 2, 5-8 -> 3 (the authors' log2 revision);
    # "exact": one context per batch size, as the paper states it (Nightjar §5.2: "each batch size b").
    bucketing: str = "log2"
    # Last log2 bucket; larger batches share it. 11 (B >= 1025) is the authors' code's cap.
    max_bucket: int = 11
    # C_sw grid, "LxB:ms" joined by "/"; default Nightjar Table 3 (RTX 4090, 7B + 0.5B draft).
    switch_cost_table: str = DEFAULT_SWITCH_COST_TABLE
    # Multiplies C_sw: 1 is the table as profiled, 0 is plain ADA-BINGREEDY (Nightjar §8.3.1, Fig. 13's baseline).
    switch_cost_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.max_k is not None and self.max_k < 0:
            raise ValueError(f"max_k={self.max_k} must be non-negative")
        if self.explore_schedule not in EXPLORE_SCHEDULES:
            choices = ", ".join(EXPLORE_SCHEDULES)
            raise ValueError(f"explore_schedule={self.explore_schedule!r} must be one of {choices}")
        if self.bucketing not in BUCKETINGS:
            raise ValueError(f"bucketing={self.bucketing!r} must be one of {', '.join(BUCKETINGS)}")
        if self.max_bucket < 0:
            raise ValueError(f"max_bucket={self.max_bucket} must be non-negative")
        if not self.switch_cost_scale >= 0:
            raise ValueError(f"switch_cost_scale={self.switch_cost_scale} must be non-negative")
        try:
            SwitchCostTable.parse(self.switch_cost_table)
        except ValueError as exc:
            raise ValueError(f"switch_cost_table: {exc}") from None


def bucket_of(num_running: int, bucketing: str = "log2", max_bucket: int = 11) -> int:
    """Batch-size context: log2 buckets 1 -> 0, 2 -> 1, 3-4 -> 2, 5-8 -> 3, 9-16 -> 4, ... capped."""
    if bucketing == "exact":
        return num_running
    return min((num_running - 1).bit_length(), max_bucket)


def exploit_k(latencies_s: Sequence[float], switch_cost_s: float, speculation_off: bool) -> int:
    """Eq. (4): the arm of least latency per token plus C_sw / k if it re-enables speculation.

    ``latencies_s[k]`` is lbar for arm k, ``inf`` if never played (it can then only win if all are).
    """

    def score(k: int) -> float:
        penalty = switch_cost_s / k if speculation_off and k > 0 else 0.0
        return latencies_s[k] + penalty

    return argmin_smallest([score(k) for k in range(len(latencies_s))])


@register
class BanditPolicy(Policy):
    """Nightjar: ADA-BINGREEDY per batch-size bucket, minimising latency per token plus switching."""

    name = "bandit"
    Params = BanditParams

    def __init__(self, params: BanditParams, traits: EngineTraits) -> None:
        super().__init__(params, traits)
        self.max_k = largest_k(params.max_k, traits)
        self.switch_costs = SwitchCostTable.parse(params.switch_cost_table)
        self._rng = random.Random(params.seed)
        self._schedules: dict[int, BinSchedule] = {}
        # Per context: plays and running mean latency per token (seconds) of each arm.
        self._counts: dict[int, list[int]] = {}
        self._means_s: dict[int, list[float]] = {}
        # Engine-wide, not per context: the draft's lag belongs to the engine, and k_prev is the k of
        # the last observed step. Algorithm 1 starts with speculation on: the first bins pay no switch.
        self._k_prev = self.max_k
        self._lag = DraftLag()
        self._last_bucket = 0
        self._last_switch_cost_s = 0.0
        self.num_explore_bins = 0
        self.num_exploit_bins = 0
        self.num_reenables = 0

    def bucket(self, num_running: int) -> int:
        return bucket_of(num_running, self.params.bucketing, self.params.max_bucket)

    def schedule(self, bucket: int) -> BinSchedule:
        """The block/bin/round state of one context (created on first use)."""
        return self._schedules.setdefault(bucket, BinSchedule())

    def choose(self, ctx: StepContext) -> Decision:
        self._lag.see(ctx.draft_resident)
        if ctx.num_running == 0:
            return Decision(k=0)  # nothing decodes: not a round on any timeline
        self._last_bucket = bucket = self.bucket(ctx.num_running)
        schedule = self.schedule(bucket)
        if schedule.at_bin_start:
            self._start_bin(schedule, ctx)
        # The draft cannot run while offloaded: k = 0, and the bin proceeds (Nightjar serves with speculation
        # disabled until the draft is back, §8.3.6).
        k = schedule.k if ctx.draft_resident else 0
        schedule.advance()
        return Decision(k=k)

    def _start_bin(self, schedule: BinSchedule, ctx: StepContext) -> None:
        available_k = self.max_k if ctx.draft_resident else 0
        schedule.explore = self._rng.random() < explore_probability(schedule.bin, self.params.explore_schedule)
        if schedule.explore:
            self.num_explore_bins += 1
            schedule.k = self._rng.randint(0, available_k)
        else:
            self.num_exploit_bins += 1
            schedule.k = self.exploit(ctx) if ctx.draft_resident else 0

    def exploit(self, ctx: StepContext) -> int:
        """Eq. (4) for this step's context, from the statistics, lag and previous k observed so far."""
        self._last_switch_cost_s = self.switch_cost_s(ctx)
        latencies = self.mean_latencies_s(self.bucket(ctx.num_running))
        return exploit_k(latencies, self._last_switch_cost_s, speculation_off=self._k_prev == 0)

    def switch_cost_s(self, ctx: StepContext) -> float:
        """C_sw(L_eff, B) in seconds for re-enabling speculation at this step."""
        lag = self._lag.effective(ctx.num_context_tokens, ctx.num_running)
        resume = self.traits.resume_s_per_token
        if resume is None:
            return self.params.switch_cost_scale * self.switch_costs.cost_s(lag, ctx.num_running)
        return self.params.switch_cost_scale * measured_resume_s(resume, lag, ctx.num_running)

    def observe(self, record: StepRecord) -> None:
        self._lag.observe(record.k, record.num_draft_passes, record.num_batched_tokens, record.num_running)
        if record.num_running > 0:
            # k_{t-1} of Eq. (4) is the k the engine actually ran last, engine-wide (module docstring).
            if self._k_prev == 0 and record.k > 0:
                self.num_reenables += 1
            self._k_prev = record.k
        if record.num_running <= 0 or record.duration_s <= 0 or record.num_emitted_tokens <= 0 or record.k > self.max_k:
            return  # no decode, nothing measured, or another policy's arm
        # Latency per token per request, tau * B / m (the authors' code's reward inverted).
        latency_s = record.duration_s * record.num_running / record.num_emitted_tokens
        bucket = self.bucket(record.num_running)
        counts = self._counts.setdefault(bucket, [0] * (self.max_k + 1))
        means = self._means_s.setdefault(bucket, [0.0] * (self.max_k + 1))
        counts[record.k] += 1
        means[record.k] += (latency_s - means[record.k]) / counts[record.k]

    def mean_latencies_s(self, bucket: int) -> list[float]:
        """lbar per arm for a context; ``inf`` for arms never played there."""
        counts = self._counts.get(bucket, [0] * (self.max_k + 1))
        means = self._means_s.get(bucket, [0.0] * (self.max_k + 1))
        return [mean if count else float("inf") for mean, count in zip(means, counts, strict=True)]

    def describe(self) -> dict[str, float]:
        out = {
            "bucket": float(self._last_bucket),
            "num_contexts": float(len(self._schedules)),
            "num_explore_bins": float(self.num_explore_bins),
            "num_exploit_bins": float(self.num_exploit_bins),
            "num_reenables": float(self.num_reenables),
            "draft_lag_tokens": float(self._lag.tokens),
            "switch_cost_s": self._last_switch_cost_s,
        }
        for k, latency_s in enumerate(self.mean_latencies_s(self._last_bucket)):
            if latency_s != float("inf"):
                out[f"latency_per_token_s_k{k}"] = latency_s
        return out
