"""KV capacity accounting for draft offload (Nightjar §6, Table 4).

The draft's weights, once offloaded, become extra KV blocks: N_draft = ceil(S_draft / s_blk) blocks appended
after the baseline pool, so the expanded pool holds N_exp = N_base + N_draft blocks. Block ids [0, N_base) are
the preserved region that survives contraction, [N_base, N_exp) the extra region that contraction takes back.
Worked example (tests): a 0.5B draft of 942.5 MiB over 896 KiB blocks (DeepSeek-R1-Distill-Qwen-7B, 16 tokens a
block) is 1,078 blocks, +26 % on Nightjar's 4,112-block pool.

Beyond Nightjar: where the draft's KV shares the target's block ids (vLLM: every block holds a page of every
layer, target and draft), a block of the offloaded engine needs no draft pages, so the draft's share of every
baseline block is lent too. The expanded pool's blocks are then target-only (s_blk - s_dkv bytes each), and the
lent bytes are S_draft + N_base * s_dkv. With s_dkv = 0 (a draft without KV in the pool, as the simulator's
profiles count it) this is Nightjar's rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KvCapacity:
    num_base_blocks: int  # N_base: the pool sized with the draft resident
    draft_bytes: int  # S_draft: weight bytes the offload frees on this device
    bytes_per_block: int  # s_blk: one block of every layer's K and V (target's and, in vLLM, the draft's)
    draft_kv_bytes_per_block: int = 0  # s_dkv: the draft layers' share of s_blk, lent while the draft is away

    def __post_init__(self) -> None:
        for name in ("num_base_blocks", "draft_bytes", "bytes_per_block"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be positive")
        if not 0 <= self.draft_kv_bytes_per_block < self.bytes_per_block:
            raise ValueError(
                f"draft_kv_bytes_per_block={self.draft_kv_bytes_per_block} must be at least 0 and below "
                f"bytes_per_block={self.bytes_per_block}"
            )

    @property
    def target_bytes_per_block(self) -> int:
        """A block of the expanded pool: the target's layers only."""
        return self.bytes_per_block - self.draft_kv_bytes_per_block

    @property
    def lent_bytes(self) -> int:
        """What the offload lends the KV cache: the draft's weights and its KV share of every baseline block."""
        return self.draft_bytes + self.num_base_blocks * self.draft_kv_bytes_per_block

    @property
    def num_draft_blocks(self) -> int:
        """N_draft: blocks the lent bytes buy; rounded up, as the freed region is allocated whole."""
        return math.ceil(self.lent_bytes / self.target_bytes_per_block)

    @property
    def num_expanded_blocks(self) -> int:
        """N_exp = N_base + N_draft."""
        return self.num_base_blocks + self.num_draft_blocks

    def is_extra(self, block_id: int) -> bool:
        """Whether a block lies in the region contraction takes back."""
        return block_id >= self.num_base_blocks
