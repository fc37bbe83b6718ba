"""Per batch-size bucket and k: how far the step-time model misses, learned from the steps themselves.

A global latency fit (``step_latency``, ``HINGED``) has to share its coefficients across every batch size and
k. Where the GPU's cost bends with the context as well as the tokens (the ridge point moves with the KV read)
the fit is biased, and the bias differs by k: on the simulator's nightjar-a100-13b-dynamic scenario it priced
each extra draft at ~1.6 ms per step at batch 32 where the true cost was ~0.5 ms, and settled one k short of
the best.

Nightjar keeps its statistics per batch size for the same reason (§5.2: the best k depends on the batch
size). We keep, per power-of-two bucket, the model's out-of-sample miss as a ratio (measured over predicted
seconds), split in two: a level common to every k, and per k an offset from it. A step at k is predicted to
take the model's seconds x (level + offset of k). The offset of a k never run in a bucket is that of the k run
most there, so an unexplored k inherits the bucket's level but not a slope correction; the policy's neighbour
exploration supplies the neighbours.

Two guards keep a served engine's outliers (a step stalled by a collection, a neighbour process, a first run
of a shape) from deciding k. A ratio counts at most 1 + ``max_relative``, so one 400 ms stall among 40 ms
steps moves an offset by what one 80 ms step would. And an offset is shrunk toward its bucket's main k's by
``prior_samples`` pseudo-samples: a k run a few times in a bucket (an exploration, a warm start's history)
earns its own correction only as its samples add up. Without them, one stalled k = 0 step at batch 1 priced
k = 0 at 146 ms against 33 ms for k = 1, and a few quick k = 4 steps priced k = 4 below k = 3 for a whole run.

The level keeps the machine's own phases out of the offsets. A served engine's steps all run slower for a
while when something else takes the cores (by 15-20 % for minutes on a shared 2-core machine), whatever k is.
When each k averaged its whole miss, a k measured in a slow minute (a run of one k, or the stretch a policy
spent there) kept that minute's price for as long as its average remembered it: on a served CPU engine at 16
clients, warm-started on a benchmark's fixed-k runs, `adaptive` priced k = 0 and k = 1 by the minutes they
had run in and held k = 2, 7 % slower than either, for a whole run. Now the level follows the bucket's main k
(the k run most there) over about ``level_memory`` steps, and the main k's offset holds still; every other
k's offset learns, at 1 / ``memory``, that k's miss beside the level of the moment: how it differs from the
main k measured around it (neighbour explorations put other k beside the current one). A phase that passes
while the main k runs lands in the level and leaves with it; one that passes while another k runs lands about
``memory / (memory + level_memory)`` of itself in the level. The level scales every k alike, so it moves no k
against another.
"""

from __future__ import annotations

import math


def bucket_of(num_running: int) -> int:
    """Power-of-two bucket: 1, 2, 3-4, 5-8, ... are buckets 0, 1, 2, 3, ..."""
    return max(0, int(num_running) - 1).bit_length()


class BucketCorrection:
    """Per bucket, a level over about the last ``level_memory`` steps and, per k, an offset over about the last
    ``memory`` steps at that k: a step is predicted to take the model's seconds x (level + offset of k)."""

    def __init__(
        self,
        memory: float = 20.0,
        *,
        prior_samples: float = 3.0,
        max_relative: float = 1.0,
        level_memory: float = 4.0,
    ) -> None:
        if not memory >= 1.0:
            raise ValueError(f"memory={memory} must be at least 1 sample")
        if not prior_samples >= 0.0:
            raise ValueError(f"prior_samples={prior_samples} must not be negative")
        if not max_relative > 0.0:
            raise ValueError(f"max_relative={max_relative} must be positive")
        if not level_memory >= 1.0:
            raise ValueError(f"level_memory={level_memory} must be at least 1 sample (math.inf: no level)")
        self._keep = 1.0 - 1.0 / memory
        self._prior = prior_samples
        self._max_relative = max_relative
        self._level_keep = 1.0 - 1.0 / level_memory if math.isfinite(level_memory) else None
        # bucket -> k -> [offset from the bucket's level, decayed sample weight]
        self._cells: dict[int, dict[int, list[float]]] = {}
        # bucket -> [level, decayed sample weight]
        self._levels: dict[int, list[float]] = {}

    def observe(self, num_running: int, k: int, measured_s: float, predicted_s: float) -> None:
        """One step: it took ``measured_s`` where the model, before seeing it, predicted ``predicted_s``."""
        if not predicted_s > 0.0:
            return  # a model predicting no time has no ratio to miss by
        bucket = bucket_of(num_running)
        ratio = min(max(measured_s / predicted_s, 1.0 - self._max_relative), 1.0 + self._max_relative)
        cells = self._cells.setdefault(bucket, {})
        cell = cells.setdefault(k, [0.0, 0.0])
        cell[1] = self._keep * cell[1] + 1.0
        level = self._levels.setdefault(bucket, [1.0, 0.0])
        main = _main(cells)
        # With a level, the main k's offset holds still and the level follows it; the others learn their
        # difference from it. Without one the level stays 1 and every offset learns its k's whole miss.
        if self._level_keep is None or cell is not main:
            cell[0] += (ratio - level[0] - cell[0]) / cell[1]
        if self._level_keep is not None:
            level[1] = self._level_keep * level[1] + 1.0
            level[0] += (ratio - self._offset(cell, main) - level[0]) / level[1]

    def level(self, num_running: int) -> float:
        """The bucket's part of every k's factor (1 before any step, and always where no level is kept)."""
        return self._level_at(bucket_of(num_running))

    def factor(self, num_running: int, k: int) -> float:
        """What to multiply the model's seconds by for a step at ``k`` with ``num_running`` requests."""
        return self.factors(num_running, k + 1)[k]

    def factors(self, num_running: int, num_k: int) -> list[float]:
        """``factor`` for k = 0 .. num_k - 1, at least 0.1 (never a free or negative step)."""
        bucket = bucket_of(num_running)  # found once: a policy asks every step
        level = self._level_at(bucket)
        return [max(level + offset, 0.1) for offset in self._offsets_at(bucket, num_k)]

    def offsets(self, num_running: int, num_k: int) -> list[float]:
        """Each k's offset, shrunk toward the bucket's main k's (0 in a bucket not seen)."""
        return self._offsets_at(bucket_of(num_running), num_k)

    def _level_at(self, bucket: int) -> float:
        level = self._levels.get(bucket)
        return 1.0 if level is None else level[0]

    def _offsets_at(self, bucket: int, num_k: int) -> list[float]:
        cells = self._cells.get(bucket)
        if not cells:
            return [0.0] * num_k
        main, get, offset = _main(cells), cells.get, self._offset
        return [offset(get(k), main) for k in range(num_k)]

    def _offset(self, cell: list[float] | None, main: list[float] | None) -> float:
        if main is None:
            return 0.0
        if cell is None or cell is main:
            return main[0]
        return (cell[0] * cell[1] + main[0] * self._prior) / (cell[1] + self._prior)

    def num_samples(self, num_running: int, k: int) -> float:
        cell = self._cells.get(bucket_of(num_running), {}).get(k)
        return cell[1] if cell is not None else 0.0


def _main(cells: dict[int, list[float]]) -> list[float] | None:
    """The bucket's main cell: the k with the most (decayed) samples there."""
    # max(cells.values(), key=lambda c: c[1]) without the key's calls: the first of the largest, as max keeps.
    main = None
    for cell in cells.values():
        if main is None or cell[1] > main[1]:
            main = cell
    return main
