"""The simulator calls its policies through the engine's guard: a broken policy costs k = 0 steps, not the run."""

from __future__ import annotations

from collections import Counter

import numpy as np
from sim_helpers import small_scenario

from specserve.sim import simulate
from specserve.speculation import Decision, EngineTraits, Policy, StepContext, make_policy


def broken(traits: EngineTraits) -> Policy:
    """fixed:k=3 that raises every third step and answers k=99 every third step after it."""
    policy = make_policy("fixed:k=3", traits)
    steps = iter(range(10**9))

    def choose(ctx: StepContext) -> Decision:
        step = next(steps)
        if step % 3 == 0:
            raise RuntimeError("broken on purpose")
        return Decision(k=99) if step % 3 == 1 else Decision(k=3)

    policy.choose = choose  # type: ignore[method-assign]
    return policy


def test_a_policy_that_raises_and_answers_out_of_range_runs_to_the_end_at_k0_on_those_steps():
    result = simulate(small_scenario(), broken, seed=0)
    assert np.isfinite(result.table.finish_s).all()  # every request finished
    ks = np.concatenate([r.series_k for r in result.replicas])
    assert set(ks.tolist()) <= {0, 3}
    errors = sum((r.guard.errors for r in result.replicas), start=Counter[str]())
    # Two of every three steps failed, each counted where it failed and run at k = 0; the others speculated.
    assert errors["choose"] + errors["bad_k"] == np.count_nonzero(ks == 0)
    assert errors["choose"] >= errors["bad_k"] > 0
    assert np.count_nonzero(ks == 3) > 0
