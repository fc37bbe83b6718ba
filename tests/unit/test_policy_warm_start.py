"""A policy set on a running engine starts from the steps the engine already ran (``Policy.warm_start``)."""

from __future__ import annotations

import random

import pytest
from speculation_synthetic import make_record

from specserve.speculation import EngineTraits, StepContext, make_policy, policy_names
from specserve.speculation.policy import SIMULATOR_ONLY

# A CPU-like engine: every batched token costs 0.5 ms, so a draft token costs about what it saves.
CPU_STEP = (5e-3, 0.0, 5e-4, 1e-3, 0.0)
TRAITS = EngineTraits(max_k=4, k0_runs_draft_pass=False, resume_s_per_token=1e-5)


def engine_history(num_steps: int = 600, alpha: float = 0.6, seed: int = 3) -> list:
    """Steps of fixed-k runs at 16 clients, k cycling 0..4 as a benchmark's interleaved rounds do."""
    rng = random.Random(seed)
    return [
        make_record(
            rng,
            CPU_STEP,
            now_s=0.03 * step,
            k=(step // 100) % 5,
            num_running=16,
            alpha=alpha,
            num_context_tokens=16 * 60,
            k0_runs_draft_pass=False,
        )
        for step in range(num_steps)
    ]


def decode_ctx(batch: int = 16) -> StepContext:
    return StepContext(now_s=100.0, num_running=batch, num_waiting=0, num_context_tokens=batch * 60)


def test_warm_start_is_what_observing_the_same_steps_teaches() -> None:
    history = engine_history()
    warm, observed, cold = (make_policy("adaptive", TRAITS) for _ in range(3))
    warm.warm_start(history)
    for record in history:
        observed.observe(record)
    assert warm.describe() == observed.describe()
    assert warm.describe()["latency_s_per_batched_token"] != cold.describe()["latency_s_per_batched_token"]


def test_a_warm_adaptive_stops_speculating_at_once_where_drafts_do_not_pay() -> None:
    # At 16 requests k = 0 gives 16 tokens per 13 ms; k = 1, 25.6 per 22 ms; deeper k less still.
    cold, warm = make_policy("adaptive", TRAITS), make_policy("adaptive", TRAITS)
    warm.warm_start(engine_history())
    assert cold.choose(decode_ctx()).k > 0, "the cold prior prices a batched token at GPU cost"
    assert warm.choose(decode_ctx()).k == 0
    assert warm.describe()["mean_alpha"] == pytest.approx(0.6, abs=0.1)


@pytest.mark.parametrize("name", sorted(set(policy_names()) - set(SIMULATOR_ONLY)))
def test_every_policy_takes_a_warm_start_and_then_chooses_a_k_the_engine_can_run(name: str) -> None:
    policy = make_policy(name, TRAITS)
    policy.warm_start(engine_history(num_steps=200))
    assert 0 <= policy.choose(decode_ctx()).k <= TRAITS.max_k


def test_adaptive_learns_step_costs_only_from_a_history_that_ran_more_than_one_k() -> None:
    one_k = [r for r in engine_history() if r.k == 3]
    warm, cold = make_policy("adaptive", TRAITS), make_policy("adaptive", TRAITS)
    warm.warm_start(one_k)
    latency = {name: v for name, v in warm.describe().items() if name.startswith("latency_")}
    assert latency == {name: v for name, v in cold.describe().items() if name.startswith("latency_")}
    assert warm.describe()["mean_alpha"] == pytest.approx(0.6, abs=0.1), "acceptance is learned all the same"
    varied = make_policy("adaptive", TRAITS)
    varied.warm_start(engine_history())
    assert varied.describe()["latency_s_per_batched_token"] != cold.describe()["latency_s_per_batched_token"]
