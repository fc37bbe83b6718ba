"""Draft residency parameters, with Nightjar's defaults where the paper gives one (§6.1, §8.3.7-8.3.8)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ResidencyParams:
    # eta: offload once free KV blocks stay below this share of the pool (Nightjar §8.3.7, Fig. 17: 10 %).
    low_free_ratio: float = 0.10
    # W: consecutive scheduler steps a trigger must hold, for offload and for reload alike (Nightjar §8.3.8,
    # Table 11: W = 3 offloaded once where W = 1 offloaded five times).
    window_steps: int = 3
    # delta, the reload's safety buffer, as a share of the baseline pool: reload needs free >= N_draft + delta, so
    # a reloaded draft starts with delta free blocks. Twice eta leaves a gap of eta between where reload stops
    # and offload starts (hysteresis); the paper names the buffer but gives no value.
    reload_buffer_ratio: float = 0.20
    # Drain-aware contraction (Nightjar §6.1): start once at most this share of the extra region is live, so
    # that few blocks move. Nightjar's burst trace moved 292 blocks, about 27 % of the 7B draft's 1,078 (App. C,
    # Table 14), in 12 ms.
    max_migrate_ratio: float = 0.30
    # Past this many seconds of waiting for the extra region to drain, migrate whatever is live.
    drain_timeout_s: float = 5.0
    # After a failed transfer, wait this long before wanting it again; doubles per consecutive failure.
    retry_s: float = 5.0
    retry_max_s: float = 120.0
    # Dwell: after a reload, the offload trigger may not act for this many seconds, so that a draft just copied back
    # (0.3-2 s of contraction and copy) is not thrown away by the next swing of an oscillating load; the window
    # still counts meanwhile. 0, as Nightjar: in the simulator W and the reload's buffer already keep a reloaded
    # draft resident 8.7 s or more, so dwells of 1-3 reloads change nothing, and a binding one (10 s) trims cycles
    # without helping latency (bench/results/memory-dwell.md).
    min_resident_s: float = 0.0

    def __post_init__(self) -> None:
        checks = {
            "low_free_ratio": 0.0 < self.low_free_ratio < 1.0,
            "window_steps": self.window_steps >= 1,
            "reload_buffer_ratio": 0.0 <= self.reload_buffer_ratio < 1.0,
            "max_migrate_ratio": 0.0 <= self.max_migrate_ratio <= 1.0,
            "drain_timeout_s": self.drain_timeout_s >= 0,
            "retry_s": self.retry_s > 0,
            "retry_max_s": self.retry_max_s >= self.retry_s,
            "min_resident_s": math.isfinite(self.min_resident_s) and self.min_resident_s >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)} is out of range")
