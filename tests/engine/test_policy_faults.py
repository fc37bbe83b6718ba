"""Engine tier: a policy that raises and answers nonsense costs k = 0 steps and error counts, never the output."""

from __future__ import annotations


def delta(after, before):
    return [a - b for a, b in zip(after, before, strict=True)]


def test_a_broken_policy_serves_the_batch_of_plain_greedy_decoding_and_its_errors_are_counted(shared_engine):
    engine = shared_engine  # its policy modules include broken_policy
    engine.set_policy("fixed:k=0")
    plain = engine.generate(max_tokens=40)
    before = engine.telemetry()
    engine.set_policy("test-broken:k=3")
    assert engine.generate(max_tokens=40) == plain
    during = engine.telemetry()
    errors = {kind: n - before.policy.errors.get(kind, 0) for kind, n in during.policy.errors.items()}
    assert errors["choose"] > 0 and errors["bad_k"] > 0 and errors["observe"] > 0
    # The steps between the failures speculated at the policy's k; the failed ones ran at k = 0.
    steps = delta(during.speculation.num_steps_by_k, before.speculation.num_steps_by_k)
    assert steps[3] > 0 and steps[0] >= errors["choose"] + errors["bad_k"]
    # Asked once a step that ran: never for vLLM's step after the last request finished, which runs nothing.
    assert during.policy.info["num_chosen"] == sum(steps)
    # The NaN estimate is dropped (and counted); the finite one is reported.
    assert "estimate" not in during.policy.info and during.policy.info["num_chosen"] > 0
    assert errors["describe"] >= 1
    # Counts are cumulative across a policy change, as the errors metric needs.
    engine.set_policy("fixed:k=0")
    assert engine.telemetry().policy.errors["choose"] >= during.policy.errors["choose"]
