"""Engine tier: prefix caching on an engine whose draft skips its k = 0 passes.

A request that starts at a prefix-cache hit computes only its uncached tokens: the cached blocks' KV is what the
request that filled them wrote. Their target half is exact; their draft half may never have been written. A
conversation's first turn decoded at k = 0 skipped the draft's pass at every step after its prefill, so the blocks
it filled hold no draft KV for its output, and its second turn starts on exactly those blocks. Both engine processes
count a request's cached prefix as draft lag when it enters the batch (``DraftKVTracker.forget``) and catch it up
in its first pass: outputs equal plain decoding's, and the second turn speculates as well as one that hit nothing.
"""

from __future__ import annotations

import pytest
from engine_helpers import KV_BLOCK_TOKENS, PROMPTS

FIRST = PROMPTS[:2]
# With an opening's few tokens: two whole blocks and part of a third, so a second turn hits two blocks.
FIRST_TURN_TOKENS = 280
SECOND_TURN_TOKENS = 96


@pytest.fixture(scope="module")
def engine(shared_engine):
    return shared_engine


def test_a_second_turn_on_a_k0_first_turns_blocks_catches_their_draft_kv_up(engine):
    first = engine.cold_turn("fixed:k=0", FIRST, FIRST_TURN_TOKENS)
    # Every step after the prefill skipped the draft's pass: the first turn's output has no draft KV in its blocks.
    assert first.skipped >= FIRST_TURN_TOKENS - len(FIRST)
    second = engine.next_turn(first)
    assert all(len(p["prompt_token_ids"]) > 2 * KV_BLOCK_TOKENS for p in second)

    engine.set_policy("fixed:k=4")
    hit = engine.turn(second, SECOND_TURN_TOKENS)
    # Each second turn started at the first turn's two whole blocks, and its first pass caught the draft up over
    # exactly them: both processes counted the same, and at k = 4 nothing else lagged.
    assert hit.num_cached_tokens == [2 * KV_BLOCK_TOKENS] * len(second)
    assert hit.caught_up == hit.worker_caught_up == len(second)
    assert hit.catch_up_tokens == hit.worker_catch_up_tokens == sum(hit.num_cached_tokens)

    # The same second turns on an empty prefix cache: plain decoding, and k = 4.
    plain = engine.cold_turn("fixed:k=0", second, SECOND_TURN_TOKENS)
    cold = engine.cold_turn("fixed:k=4", second, SECOND_TURN_TOKENS)
    assert plain.num_cached_tokens == cold.num_cached_tokens == [0] * len(second)
    assert cold.catch_up_tokens == cold.worker_catch_up_tokens == 0
    assert hit.tokens == plain.tokens == cold.tokens
    # Drafting on the first turn's blocks as they were (no draft KV past the openings' few tokens) lowers acceptance
    # at every position (taking a hit's prefix as complete: 0.39 against 0.52 at the first); caught up, the hit
    # drafts as the cold run does.
    assert cold.acceptance()[0] > 0.3
    for pos, (ours, base) in enumerate(zip(hit.acceptance(), cold.acceptance(), strict=True)):
        assert ours == pytest.approx(base, abs=0.05), f"position {pos}: {ours:.3f} after the hit vs {base:.3f} cold"


def test_a_cache_salt_keeps_identical_prompts_apart(engine):
    """What `bench compare` relies on to give every policy of a round the same prompts: each run sends a
    ``cache_salt`` of its own, and a request hits only blocks filled under its own salt."""
    first = engine.cold_turn("fixed:k=0", FIRST[:1], FIRST_TURN_TOKENS)
    (prompt,) = engine.next_turn(first)

    def cached(salt: str) -> int:
        (n,) = engine.turn([{**prompt, "cache_salt": salt}], 1).num_cached_tokens
        return n

    assert cached("run-0") == 0
    assert cached("run-1") == 0, "another salt: nothing to hit"
    assert cached("run-0") == 2 * KV_BLOCK_TOKENS, "the same salt hits"
