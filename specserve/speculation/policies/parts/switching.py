"""The cost of re-enabling speculation: the draft re-prefills the tokens it skipped while k was 0.

Nightjar §5.2 ("Prefill Cost Modeling", Table 3):
C_sw(L, B) = T_prefill_with_SD - T_prefill_target, profiled offline over input lengths L x batch sizes
B, looked up at the effective skip length L_eff (the largest lag in the batch) and the current B;
"unseen pairs are estimated by interpolation over nearby profiled points". The paper does not say how,
so, choosing:

- in B, linear in log2 B (the grid is geometric: "2, 4, 8, ..."), clamped at the grid's edges;
- in L, linear between profiled lengths, through C = 0 at L = 0 (nothing skipped, nothing to
  re-prefill), and proportional to L beyond the largest length (prefill cost grows with tokens).

The raw table is kept as profiled, not smoothed to be monotone ((256, 64) < (128, 64) in Table 3): the
paper interpolates the measurements, and a smoothing rule would be ours to invent.

Written in a spec as ``LxB:ms`` entries joined by ``/``; the entries must fill the L x B grid.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

# Nightjar Table 3 (RTX 4090, DeepSeek-R1-Distill-Qwen-7B with a 0.5B draft), milliseconds.
DEFAULT_SWITCH_COST_TABLE = "128x32:17.87/128x64:28.53/256x32:20.65/256x64:22.33/512x32:24.30/512x64:102.03"


@dataclass(frozen=True, slots=True)
class SwitchCostTable:
    """C_sw over a grid of skip lengths x batch sizes, in seconds."""

    # Profiled skip lengths (tokens) and batch sizes, both ascending.
    lengths: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    # costs_s[i][j]: seconds to re-prefill lengths[i] tokens for batch_sizes[j] requests.
    costs_s: tuple[tuple[float, ...], ...]

    @classmethod
    def parse(cls, text: str) -> SwitchCostTable:
        """Parse ``LxB:ms/...``; errors name the bad entry."""
        cells: dict[tuple[int, int], float] = {}
        for part in text.split("/"):
            entry = part.strip()
            point, sep, ms_text = entry.partition(":")
            length_text, x, batch_text = point.partition("x")
            try:
                if not sep or not x:
                    raise ValueError
                length, batch, ms = int(length_text), int(batch_text), float(ms_text)
            except ValueError:
                raise ValueError(f"switch-cost entry {entry!r} is not LENxBATCH:ms") from None
            if length < 1 or batch < 1 or not ms >= 0 or math.isinf(ms):
                raise ValueError(f"switch-cost entry {entry!r} needs positive L and B and a finite ms >= 0")
            if (length, batch) in cells:
                raise ValueError(f"switch-cost entry {entry!r} repeats a grid point")
            cells[(length, batch)] = ms / 1000.0
        lengths = tuple(sorted({length for length, _ in cells}))
        batch_sizes = tuple(sorted({batch for _, batch in cells}))
        missing = [f"{length}x{batch}" for length in lengths for batch in batch_sizes if (length, batch) not in cells]
        if missing:
            raise ValueError(f"switch-cost table misses grid points {', '.join(missing)}")
        costs = tuple(tuple(cells[(length, batch)] for batch in batch_sizes) for length in lengths)
        return cls(lengths, batch_sizes, costs)

    def cost_s(self, skip_tokens: float, num_running: int) -> float:
        """Seconds to re-prefill ``skip_tokens`` per request for a batch of ``num_running``."""
        if skip_tokens <= 0:
            return 0.0
        row = [_interpolate_log2(self.batch_sizes, costs, num_running) for costs in self.costs_s]
        index = bisect_right(self.lengths, skip_tokens)
        if index == len(self.lengths):
            return row[-1] * skip_tokens / self.lengths[-1]
        low_len, low_cost = (self.lengths[index - 1], row[index - 1]) if index > 0 else (0, 0.0)
        high_len, high_cost = self.lengths[index], row[index]
        return low_cost + (high_cost - low_cost) * (skip_tokens - low_len) / (high_len - low_len)


def _interpolate_log2(points: Sequence[int], values: Sequence[float], at: float) -> float:
    """Linear in log2 between the neighbouring points, clamped to the first and last value."""
    if at <= points[0]:
        return values[0]
    if at >= points[-1]:
        return values[-1]
    index = bisect_right(points, at)
    low, high = math.log2(points[index - 1]), math.log2(points[index])
    fraction = (math.log2(at) - low) / (high - low)
    return values[index - 1] + (values[index] - values[index - 1]) * fraction


class DraftLag:
    """The largest draft lag in the batch, estimated from step records; what a resume must catch up.

    StepContext does not carry lags, so: a k = 0 step that ran no draft pass adds one token to every request's
    lag, and a request admitted then lags by at least its prompt chunk (batched tokens - B); a k = 0 step that
    still ran a draft pass (vLLM keeps the draft in sync) and any k > 0 step leave nothing to catch up. After
    the draft was offloaded (``draft_resident`` False) all of its KV is gone: the lag is at least the mean
    context per request (the max is not carried).
    """

    def __init__(self) -> None:
        self.tokens = 0
        self.offloaded = False

    def see(self, draft_resident: bool) -> None:
        """Called with each step's ``StepContext.draft_resident`` before the step runs."""
        if not draft_resident:
            self.offloaded = True

    def observe(self, k: int, num_draft_passes: int, num_batched_tokens: int, num_running: int) -> None:
        if k > 0:
            self.tokens, self.offloaded = 0, False  # the draft ran, after catching up
        elif num_draft_passes > 0:
            self.tokens = 0  # k = 0 that still kept the draft's KV in sync
        else:
            prefill_tokens = max(0, num_batched_tokens - num_running)
            self.tokens = max(self.tokens + (1 if num_running > 0 else 0), prefill_tokens)

    def effective(self, num_context_tokens: int, num_running: int) -> float:
        """L_eff in tokens for a batch with this context: no request lags by more than its own context, which
        bounds the count of a long k = 0 stretch that outlived the requests it started with."""
        lag = float(self.tokens)
        if self.offloaded and num_running > 0:
            lag = max(lag, num_context_tokens / num_running)
        return min(lag, float(num_context_tokens))


def measured_resume_s(resume_s_per_token: float, lag_tokens: float, num_running: int) -> float:
    """An engine's own measured catch-up: every request catches up its lag less the one token the last pass
    wrote ahead (draft_sync), in one forward."""
    return resume_s_per_token * max(lag_tokens - 1.0, 0.0) * num_running
