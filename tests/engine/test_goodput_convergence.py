"""Engine tier: the goodput policy on real engines with known acceptance (self draft = 1, random = 0)."""

from __future__ import annotations

import time

import pytest
from engine_helpers import running_engine


# `make test-slow`'s (CI time: `make test` reached its 15 minutes): goodput's argmax is unit-tested and converges
# in the simulator's runs; the engine keeps the k = 0 side below, where the engine's own skip is what is tested.
@pytest.mark.slow
def test_goodput_converges_to_k_max_with_a_perfect_draft(self_pair):
    with running_engine(self_pair, policy="goodput:max_k=4") as engine:
        engine.generate(max_tokens=64)  # a warm-up round the policy learns from
        before = engine.telemetry()
        for _ in range(3):
            engine.generate(max_tokens=64)
        after = engine.telemetry()
    steps = [a - b for a, b in zip(after.speculation.num_steps_by_k, before.speculation.num_steps_by_k, strict=True)]
    explorations = after.policy.info["num_explorations"] - before.policy.info["num_explorations"]
    assert after.acceptance > 0.95
    # A round's first step only prefills (nothing decodes yet, so it runs at k = 0). Every other step runs at
    # k_max but goodput's neighbour explorations, one step at k - 1 per explore_interval_s of wall time (so
    # their share grows on a slow machine): settled at k_max means no step below k - 1 and none at k - 1
    # beyond the explorations.
    assert steps[0] <= 3 and steps[1] == steps[2] == 0, steps
    assert steps[3] <= explorations < steps[4], (steps, explorations)


# `make test-slow`'s too (CI time: `make test` reached 15 minutes again, 926 s on 2026-12-06): what the engine adds
# to this, a k = 0 that skips the draft and drafts verified again after it, is test_k0_skip.py's resumption tests' on
# the shared engine, and goodput's k = 0 rule and probes are unit- and simulator-tested.
@pytest.mark.slow
def test_goodput_turns_speculation_off_with_a_useless_draft_and_keeps_probing(random_pair):
    with running_engine(random_pair, policy="goodput:max_k=4,probe_interval_s=0.5") as engine:
        engine.generate(max_tokens=64)  # learn
        before = engine.telemetry()
        for _ in range(3):
            engine.generate(max_tokens=64)
        time.sleep(0.6)  # the probe clock runs on time, not on steps
        engine.generate(max_tokens=64)
        after = engine.telemetry()
    steps = [a - b for a, b in zip(after.speculation.num_steps_by_k, before.speculation.num_steps_by_k, strict=True)]
    probes = after.policy.info["num_probes"] - before.policy.info["num_probes"]
    # With k=0 skipping the draft pass, requests that lived through k=0 steps lag and draft nothing, so a
    # probe verifies only drafts of requests that arrived since: the EMA sees fewer drafts (8 rather than
    # 44 on one run) and stays nearer its prior. Measured acceptance must still be ~0 and the EMA well down.
    reached = after.speculation.num_reached_per_pos[0] - before.speculation.num_reached_per_pos[0]
    assert after.speculation.num_accepted_per_pos[0] - before.speculation.num_accepted_per_pos[0] < 0.1 * max(
        reached, 1
    )
    assert after.acceptance < 0.2
    assert steps[0] > 2 * steps[1] and steps[2:] == [0, 0, 0], steps
    # Every k > 0 step is a probe (one lasts until its drafts are verified, at most 4 steps)...
    # A probe already running when the window opened counts in the steps but not in the probes: one more.
    assert 0 < steps[1] <= 4 * (probes + 1), (steps, probes)
    # ...and probes are worth something only because their drafts do get verified.
    assert after.speculation.num_reached_per_pos[0] > before.speculation.num_reached_per_pos[0]
