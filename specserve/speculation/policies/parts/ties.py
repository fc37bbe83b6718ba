"""Arg-max / arg-min over candidate k with ties going to the smaller k (TurboSpec Listing 2's strict
``>``): a larger k must win by more than float noise, since speculating costs draft work."""

from __future__ import annotations

import math
from collections.abc import Sequence

# Relative margin a larger k must beat the best smaller k by.
TIE_RELATIVE_TOLERANCE = 1e-9


def _margin(value: float) -> float:
    return abs(value) * TIE_RELATIVE_TOLERANCE if math.isfinite(value) else 0.0


def argmax_smallest(values: Sequence[float]) -> int:
    """Index of the largest value; on (near-)ties the smallest index."""
    best = 0
    for index in range(1, len(values)):
        if values[index] > values[best] + _margin(values[best]):
            best = index
    return best


def argmin_smallest(values: Sequence[float]) -> int:
    """Index of the smallest value; on (near-)ties the smallest index."""
    best = 0
    for index in range(1, len(values)):
        if values[index] < values[best] - _margin(values[best]):
            best = index
    return best
