"""Engine tier: the goodput policy on real engines with known acceptance (self draft = 1, random = 0)."""

from __future__ import annotations

import time

from engine_helpers import running_engine


def late_steps(engine, rounds: int = 3, max_tokens: int = 64) -> list[int]:
    """Steps by k over the last rounds, after a warm-up round the policy learns from."""
    engine.generate(max_tokens=max_tokens)
    before = engine.telemetry()
    for _ in range(rounds):
        engine.generate(max_tokens=max_tokens)
    after = engine.telemetry()
    return [a - b for a, b in zip(after.num_steps_by_k, before.num_steps_by_k)]


def test_goodput_converges_to_k_max_with_a_perfect_draft(self_pair):
    with running_engine(self_pair, policy="goodput:k_max=4") as engine:
        steps = late_steps(engine)
        telemetry = engine.telemetry()
    assert telemetry.acceptance > 0.95
    assert telemetry.k == 4
    assert steps[4] >= 0.9 * sum(steps), steps


def test_goodput_turns_speculation_off_with_a_useless_draft_and_keeps_probing(random_pair):
    with running_engine(random_pair, policy="goodput:k_max=4,probe_interval_s=0.2") as engine:
        steps = late_steps(engine)
        probes_before = engine.telemetry().policy_info["num_probes"]
        time.sleep(0.3)  # the probe clock runs on time, not on steps
        engine.generate(max_tokens=64)
        telemetry = engine.telemetry()
    assert telemetry.acceptance < 0.1
    assert steps[0] >= 0.9 * sum(steps), steps
    assert sum(steps[1:]) > 0, "it still probes after settling on k=0"
    assert telemetry.policy_info["num_probes"] > probes_before
