"""ConfidenceStop: the draft loop stops when no run of further passes would raise tokens per second."""

from __future__ import annotations

import pytest

from specserve.speculation.policies.parts.early_stop import ConfidenceStop, StopCounter


def test_a_sure_draft_goes_on_and_an_unsure_one_stops() -> None:
    seconds = [1.0, 1.1, 1.2, 1.3]  # 0.1 s per pass
    # After one pass at c = 0.99: 1.99 tokens in 1.1 s; one more at alpha 0.8 gives 2.78 in 1.2 s.
    assert not ConfidenceStop(1, seconds, [0.8] * 3, max_passes=3).after_pass(0, 0.99)
    # At c = 0.05 the next draft survives with 0.04: 1.09 tokens in 1.2 s is worse than 1.05 in 1.1 s.
    assert ConfidenceStop(1, seconds, [0.8] * 3, max_passes=3).after_pass(0, 0.05)


def test_looks_past_a_pass_that_only_pays_with_the_next() -> None:
    # Passes 2 and 3 cost the same (a padded shape): pass 2 alone lowers the rate, passes 2 and 3 raise it.
    seconds = [1.0, 1.0, 1.6, 1.6]
    loop = ConfidenceStop(1, seconds, [0.9] * 3, max_passes=3)
    assert not loop.after_pass(0, 0.9)  # 1.9 / 1.0 now; 2.71 / 1.6 after one more, 3.44 / 1.6 after two


def test_the_budget_ends_the_loop_and_must_be_priced() -> None:
    loop = ConfidenceStop(8, [1.0, 1.1, 1.2], [0.8, 0.8], max_passes=2)
    assert [loop.after_pass(0, 0.99), loop.after_pass(1, 0.99)] == [False, True]
    with pytest.raises(ValueError, match="max_passes=3"):
        ConfidenceStop(8, [1.0, 1.1, 1.2], [0.8], max_passes=3)


def test_a_shared_counter_counts_early_stops_not_the_budget() -> None:
    counter = StopCounter()
    seconds = [1.0, 1.1, 1.2, 1.3]
    ConfidenceStop(1, seconds, [0.8] * 3, max_passes=3, counter=counter).after_pass(0, 0.05)  # early
    budget = ConfidenceStop(1, seconds, [0.8] * 3, max_passes=3, counter=counter)
    assert [budget.after_pass(p, 0.99) for p in range(3)] == [False, False, True]  # ran out, not early
    assert counter.count == 1
