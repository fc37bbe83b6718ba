"""``adaptive`` never runs a k whose KV slots would make the step preempt (parts.kv_fit)."""

from __future__ import annotations

from specserve.speculation import StepContext
from specserve.speculation.policies.parts.kv_fit import largest_fitting_k


def ctx(free: int, needed: tuple[int, ...]) -> StepContext:
    return StepContext(
        now_s=0.0, num_running=8, num_waiting=0, num_context_tokens=0, num_kv_blocks_free=free, kv_blocks_needed=needed
    )


def test_the_largest_k_whose_blocks_fit_runs() -> None:
    assert largest_fitting_k(ctx(3, (0, 2, 3, 5, 8)), 4) == 2
    assert largest_fitting_k(ctx(3, (0, 2, 3, 5, 8)), 1) == 1
    assert largest_fitting_k(ctx(1, (0, 2, 3, 5, 8)), 4) == 0


def test_an_engine_that_reports_no_need_leaves_k_alone() -> None:
    assert largest_fitting_k(ctx(0, ()), 4) == 4


def test_where_not_even_k0_fits_only_ks_that_add_no_blocks_run() -> None:
    # The step preempts whatever k is; k = 1 needs no more than k = 0, k = 2 would preempt more.
    assert largest_fitting_k(ctx(1, (3, 3, 5, 6, 6)), 4) == 1


def test_a_k_beyond_the_engines_count_is_cut_to_it() -> None:
    assert largest_fitting_k(ctx(100, (0, 1, 2)), 4) == 2
