"""The contraction's migration plan (Nightjar §6.4, steps 1-2): which live blocks of the extra region move to
which free blocks of the preserved region.

Contraction is drain-aware (Nightjar §6.1): it need not wait until the extra region is empty, only until few
enough live blocks are left there that moving them is cheap. The plan is a one-to-one map from each live extra
block to a free preserved block; every source is >= N_base and every destination < N_base, so no move
overwrites a block another move still has to read, and the moves may run in any order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BlockMove:
    source: int  # a live block id in the extra region
    destination: int  # a free block id in the preserved region, reserved for this move


@dataclass(frozen=True, slots=True)
class MigrationPlan:
    # New allocations must come from [0, num_base_blocks) from the moment the plan is adopted.
    num_base_blocks: int
    moves: tuple[BlockMove, ...]

    @property
    def num_moved(self) -> int:
        return len(self.moves)


def plan_migration(num_base_blocks: int, live_extra: Sequence[int], free_base: Sequence[int]) -> MigrationPlan:
    """Map each live extra block to a free preserved block, lowest ids first so the plan is deterministic.

    Raises ValueError when a source is not in the extra region, a destination is not in the preserved region,
    or there are fewer free preserved blocks than live extra ones (the caller must wait for more to drain).
    """
    sources = sorted(live_extra)
    if any(s < num_base_blocks for s in sources):
        raise ValueError(f"live_extra holds ids below num_base_blocks={num_base_blocks}")
    destinations = sorted(free_base)
    if any(d >= num_base_blocks or d < 0 for d in destinations):
        raise ValueError(f"free_base holds ids outside [0, {num_base_blocks})")
    if len(destinations) < len(sources):
        raise ValueError(
            f"free_base has {len(destinations)} blocks for {len(sources)} live extra blocks: wait for more to drain"
        )
    moves = tuple(BlockMove(s, d) for s, d in zip(sources, destinations, strict=False))
    return MigrationPlan(num_base_blocks, moves)
