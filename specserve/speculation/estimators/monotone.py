"""The closest non-decreasing sequence to a list of estimates, in weighted least squares (pool adjacent
violators). A step that drafts and verifies more never costs less, so per-k step costs must not fall with k;
estimates corrected from unequal evidence can, and the better-supported ones should decide where they meet."""

from __future__ import annotations

from collections.abc import Sequence


def nondecreasing(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """Weighted isotonic regression of ``values`` (positive ``weights``, as many)."""
    if len(values) != len(weights):
        raise ValueError(f"{len(values)} values but {len(weights)} weights")
    # Blocks of pooled neighbours: [weighted mean, total weight, length].
    blocks: list[list[float]] = []
    for value, weight in zip(values, weights, strict=True):
        if not weight > 0:
            raise ValueError(f"weight {weight} must be positive")
        blocks.append([float(value), float(weight), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, total, length = blocks.pop()
            last = blocks[-1]
            last[0] = (last[0] * last[1] + mean * total) / (last[1] + total)
            last[1] += total
            last[2] += length
    return [mean for mean, _, length in blocks for _ in range(int(length))]
