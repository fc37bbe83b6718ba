"""Per batch-size bucket and k: how far the step-time model misses, learned from the steps themselves.

A global latency fit (``step_latency``, ``HINGED``) has to share its coefficients across every batch size and
k. Where the GPU's cost bends with the context as well as the tokens (the ridge point moves with the KV read)
the fit is biased, and the bias differs by k: on the simulator's nightjar-a100-13b-dynamic scenario it priced
each extra draft at ~1.6 ms per step at batch 32 where the true cost was ~0.5 ms, and settled one k short of
the best.

Nightjar keeps its statistics per batch size for the same reason (§5.2: the best k depends on the batch
size). We keep, per power-of-two bucket and per k, an average of the model's
out-of-sample residual (measured minus predicted seconds). The correction for a k never run in a bucket is
that bucket's residual at the k run most there, so an unexplored k inherits the bucket's offset but not a
slope correction; the policy's neighbour exploration supplies the neighbours.

Two guards keep a served engine's outliers (a step stalled by a collection, a neighbour process, a first run
of a shape) from deciding k. A residual counts at most ``max_relative`` times the prediction it corrects, so
one 400 ms stall among 40 ms steps moves a cell by what one 80 ms step would. And a cell's average is shrunk
toward its bucket's main cell by ``prior_samples`` pseudo-samples: a k run a few times in a bucket (an
exploration, a warm start's history) earns its own correction only as its samples add up. Without them, one
stalled k = 0 step at batch 1 priced k = 0 at 146 ms against 33 ms for k = 1, and a few quick k = 4 steps
priced k = 4 below k = 3 for a whole run.
"""

from __future__ import annotations


def bucket_of(num_running: int) -> int:
    """Power-of-two bucket: 1, 2, 3-4, 5-8, ... are buckets 0, 1, 2, 3, ..."""
    return max(0, int(num_running) - 1).bit_length()


class BucketCorrection:
    """Averages residuals per (bucket, k) over about the last ``memory`` samples of each cell."""

    def __init__(self, memory: float = 20.0, *, prior_samples: float = 3.0, max_relative: float = 1.0) -> None:
        if not memory >= 1.0:
            raise ValueError(f"memory={memory} must be at least 1 sample")
        if not prior_samples >= 0.0:
            raise ValueError(f"prior_samples={prior_samples} must not be negative")
        if not max_relative > 0.0:
            raise ValueError(f"max_relative={max_relative} must be positive")
        self._keep = 1.0 - 1.0 / memory
        self._prior = prior_samples
        self._max_relative = max_relative
        # (bucket, k) -> [mean residual seconds, decayed sample weight]
        self._cells: dict[tuple[int, int], list[float]] = {}

    def observe(self, num_running: int, k: int, residual_s: float, predicted_s: float | None = None) -> None:
        """One step's residual (measured - predicted seconds); ``predicted_s`` bounds it (see the module's text)."""
        if predicted_s is not None:
            bound = self._max_relative * max(predicted_s, 0.0)
            residual_s = min(max(residual_s, -bound), bound)
        cell = self._cells.setdefault((bucket_of(num_running), k), [0.0, 0.0])
        cell[1] = self._keep * cell[1] + 1.0
        cell[0] += (residual_s - cell[0]) / cell[1]

    def correction_s(self, num_running: int, k: int) -> float:
        """Seconds to add to the model's prediction for a step at ``k`` with ``num_running`` requests."""
        return self.corrections_s(num_running, k + 1)[k]

    def corrections_s(self, num_running: int, num_k: int) -> list[float]:
        """``correction_s`` for k = 0 .. num_k - 1: each cell's average shrunk toward the bucket's main cell."""
        bucket = bucket_of(num_running)
        main = max((c for (b, _), c in self._cells.items() if b == bucket), key=lambda c: c[1], default=None)
        fallback = 0.0 if main is None else main[0]
        out = []
        for k in range(num_k):
            cell = self._cells.get((bucket, k))
            if cell is None or cell is main:
                out.append(fallback)
            else:
                out.append((cell[0] * cell[1] + fallback * self._prior) / (cell[1] + self._prior))
        return out

    def num_samples(self, num_running: int, k: int) -> float:
        cell = self._cells.get((bucket_of(num_running), k))
        return cell[1] if cell is not None else 0.0
