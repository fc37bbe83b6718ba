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
"""

from __future__ import annotations


def bucket_of(num_running: int) -> int:
    """Power-of-two bucket: 1, 2, 3-4, 5-8, ... are buckets 0, 1, 2, 3, ..."""
    return max(0, int(num_running) - 1).bit_length()


class BucketCorrection:
    """Averages residuals per (bucket, k) over about the last ``memory`` samples of each cell."""

    def __init__(self, memory: float = 20.0) -> None:
        if not memory >= 1.0:
            raise ValueError(f"memory={memory} must be at least 1 sample")
        self._keep = 1.0 - 1.0 / memory
        # (bucket, k) -> [mean residual seconds, decayed sample weight]
        self._cells: dict[tuple[int, int], list[float]] = {}

    def observe(self, num_running: int, k: int, residual_s: float) -> None:
        cell = self._cells.setdefault((bucket_of(num_running), k), [0.0, 0.0])
        cell[1] = self._keep * cell[1] + 1.0
        cell[0] += (residual_s - cell[0]) / cell[1]

    def correction_s(self, num_running: int, k: int) -> float:
        """Seconds to add to the model's prediction for a step at ``k`` with ``num_running`` requests."""
        return self.corrections_s(num_running, k + 1)[k]

    def corrections_s(self, num_running: int, num_k: int) -> list[float]:
        """``correction_s`` for k = 0 .. num_k - 1, the bucket's fallback found once."""
        bucket = bucket_of(num_running)
        found = [self._cells.get((bucket, k)) for k in range(num_k)]
        fallback = [0.0, 0.0]
        if None in found:
            fallback = max(
                (c for (b, _), c in self._cells.items() if b == bucket), key=lambda c: c[1], default=fallback
            )
        return [(fallback if cell is None else cell)[0] for cell in found]

    def num_samples(self, num_running: int, k: int) -> float:
        cell = self._cells.get((bucket_of(num_running), k))
        return cell[1] if cell is not None else 0.0
