"""Engine tier: a policy that raises and answers nonsense costs k = 0 steps and error counts, never the output."""

from __future__ import annotations

import pytest
from engine_helpers import running_engine


@pytest.fixture(scope="module")
def engine(trained_pair):
    with running_engine(trained_pair, policy="test-broken:k=3", policy_modules=("broken_policy",)) as engine:
        yield engine


def test_a_broken_policy_serves_the_batch_of_plain_greedy_decoding_and_its_errors_are_counted(engine):
    broken = engine.generate(max_tokens=40)
    during = engine.telemetry()
    engine.set_policy("fixed:k=0")
    assert broken == engine.generate(max_tokens=40)
    errors = during.policy_errors
    assert errors["choose"] > 0 and errors["bad_k"] > 0 and errors["observe"] > 0
    # The steps between the failures speculated at the policy's k; the failed ones ran at k = 0.
    assert during.num_steps_by_k[3] > 0 and during.num_steps_by_k[0] >= errors["choose"] + errors["bad_k"]
    # Asked once a step that ran: never for vLLM's step after the last request finished, which runs nothing.
    assert during.policy_info["num_chosen"] == sum(during.num_steps_by_k)
    # The NaN estimate is dropped (and counted); the finite one is reported.
    assert "estimate" not in during.policy_info and during.policy_info["num_chosen"] > 0
    assert errors["describe"] >= 1
    # Counts are cumulative across a policy change, as the errors metric needs.
    assert engine.telemetry().policy_errors["choose"] >= errors["choose"]
