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
