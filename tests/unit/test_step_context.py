"""The one StepContext builder shared by the vLLM scheduler and the simulator."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from specserve.speculation.context import admissible_prefill_tokens, build_step_context


def context(**overrides):
    inputs = dict(
        now_s=1.5,
        num_running=3,
        num_context_tokens=900,
        running_prefill_tokens=100,
        num_waiting=4,
        waiting_tokens=[50, 60, 70, 80],
        max_num_seqs=5,
        token_budget=512,
        num_kv_blocks_free=40,
        num_kv_blocks_total=64,
    )
    return build_step_context(**{**inputs, **overrides})


def test_only_waiting_requests_that_free_seats_admit_count_as_prefill() -> None:
    # Two free seats: the first two waiting prompts join the step, the other two wait.
    ctx = context()
    assert ctx.num_prefill_tokens == 100 + 50 + 60
    assert (ctx.num_running, ctx.num_waiting, ctx.num_context_tokens) == (3, 4, 900)
    assert (ctx.num_kv_blocks_free, ctx.num_kv_blocks_total, ctx.now_s) == (40, 64, 1.5)


def test_a_full_batch_announces_no_prefill_from_the_queue() -> None:
    ctx = context(num_running=5, running_prefill_tokens=0)
    assert ctx.num_prefill_tokens == 0
    assert ctx.num_waiting == 4


def test_prefill_is_capped_at_the_token_budget() -> None:
    assert context(token_budget=128).num_prefill_tokens == 128
    # Admission stops adding prompts once the budget is reached, whatever the seats.
    assert admissible_prefill_tokens([100, 100, 100], num_free_seats=3, token_budget=150) == 200


def test_the_queue_is_read_no_further_than_the_free_seats() -> None:
    read = []

    def queue() -> Iterator[int]:
        for n in range(1_000_000):
            read.append(n)
            yield 10

    assert admissible_prefill_tokens(queue(), num_free_seats=2, token_budget=8192) == 20
    assert len(read) == 2


@pytest.mark.parametrize("seats", [0, -1])
def test_no_seat_no_admission(seats: int) -> None:
    assert admissible_prefill_tokens([10, 20], num_free_seats=seats, token_budget=100) == 0


def test_the_blocks_each_k_needs_count_what_each_decodes_blocks_do_not_cover() -> None:
    from specserve.speculation.context import kv_blocks_needed

    # 16-token blocks. Request a fills its one block (15 computed + 1 new), so any draft needs a second block;
    # b fills its two likewise; c has 6 slots spare and one draft to verify, so no k needs a block for it.
    needed = kv_blocks_needed([15, 31, 40], [1, 2, 3], [4, 4, 1], block_size=16, max_k=4)
    assert needed == (0, 2, 2, 2, 2)
    # vLLM's lookahead slots come on top of every k's: 12 computed + 1 + 4 reserved cross into a second block at k = 0.
    assert kv_blocks_needed([12], [1], [4], block_size=16, max_k=4, lookahead_tokens=4) == (1, 1, 1, 1, 1)
    assert kv_blocks_needed([11], [1], [4], block_size=16, max_k=4, lookahead_tokens=4) == (0, 1, 1, 1, 1)
    # Nothing is allocated past the model's length.
    assert kv_blocks_needed([31], [2], [4], block_size=16, max_k=4, max_model_len=32) == (0, 0, 0, 0, 0)


def test_every_k_fits_where_each_decode_can_take_its_largest_need() -> None:
    from specserve.speculation.context import kv_blocks_needed, most_kv_blocks_per_decode

    assert most_kv_blocks_per_decode(16, 4) == 1
    assert most_kv_blocks_per_decode(16, 4, lookahead_tokens=12) == 2
    # The bound holds whatever each request holds: no k of any request needs more.
    for computed in range(0, 70):
        held = -(-computed // 16)
        assert max(kv_blocks_needed([computed], [held], [4], block_size=16, max_k=4, lookahead_tokens=12)) <= 2
    with pytest.raises(ValueError, match="block_size"):
        most_kv_blocks_per_decode(0, 4)
