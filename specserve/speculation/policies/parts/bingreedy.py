"""The block / bin / round schedule of ADA-BINGREEDY, one per batch-size context.

ADA-BINGREEDY is Luo et al.'s (COLT 2018) bandit; Nightjar §5.2 (Algorithm 1, Fig. 6) runs one copy of its
schedule per batch size. On a context's own timeline, block j lasts H_j = 2^(j-1) rounds ("upon the completion
of a block, the block size is updated via H_{j+1} = 2 H_j"); its bins last l_j = max(1, floor(sqrt(H_j))) rounds,
n_j = ceil(H_j / l_j) of them (the bin length is the authors' released code's). At the start of bin i (1-based
within the block) the bin explores with probability p_i, and its arm is locked until the bin ends. A bin ends
when its round counter reaches l_j, a block when its bin counter passes n_j.

The paper only says p_i decays with i. ``inv_sqrt`` (p_i = i^-1/2) is the authors' code and the reading
consistent with Nightjar's Appendix A.4 ("exploitation regret is dominated by the exploration term"); ``inv``
(p_i = 1/i) is how a third-party summary of one revision of the paper reads it. Either way p_1 = 1: every block
opens by exploring.
"""

from __future__ import annotations

import math

EXPLORE_SCHEDULES = ("inv_sqrt", "inv")


def explore_probability(bin_index: int, schedule: str) -> float:
    """p_i for the 1-based bin index within a block."""
    if schedule == "inv_sqrt":
        return 1.0 / math.sqrt(bin_index)
    if schedule == "inv":
        return 1.0 / bin_index
    raise ValueError(f"explore schedule {schedule!r} is not one of {', '.join(EXPLORE_SCHEDULES)}")


def block_rounds(block: int) -> int:
    """H_j = 2^(j-1): rounds in block j (1-based)."""
    return 2 ** (block - 1)


def bin_rounds(block: int) -> int:
    """l_j = max(1, floor(sqrt(H_j))): rounds in each bin of block j."""
    return max(1, math.isqrt(block_rounds(block)))


def num_bins(block: int) -> int:
    """n_j = ceil(H_j / l_j): bins in block j (the last bin may run past H_j by under l_j rounds)."""
    return -(-block_rounds(block) // bin_rounds(block))


class BinSchedule:
    """Where one context is on its own timeline, and the arm its current bin locked."""

    __slots__ = ("block", "bin", "round", "explore", "k")

    def __init__(self) -> None:
        self.block = 1  # j
        self.bin = 1  # i, 1-based within the block
        self.round = 0  # r, rounds already played in this bin
        self.explore = False  # the current bin's type, drawn at its first round
        self.k = 0  # the arm the current bin locked

    @property
    def at_bin_start(self) -> bool:
        return self.round == 0

    def advance(self) -> None:
        """One round played on this context: roll the bin, then the block, over when they end."""
        self.round += 1
        if self.round < bin_rounds(self.block):
            return
        self.round = 0
        self.bin += 1
        if self.bin > num_bins(self.block):
            self.bin = 1
            self.block += 1
