"""Engine tier: a real vLLM engine on CPU with specserve's per-step control loop."""

from __future__ import annotations

import pytest
from engine_helpers import running_engine


@pytest.fixture(scope="module")
def engine(trained_pair):
    with running_engine(trained_pair, policy="fixed:k=4") as engine:
        yield engine


def delta(after, before):
    return [a - b for a, b in zip(after, before, strict=True)]


def test_a_fresh_engine_starts_from_a_controllers_acceptance_prior_and_ignores_one_once_it_has_drafted(engine):
    # First in the module, on purpose: the prior is for an engine that has verified no draft yet.
    from specserve.replicas.tools.offline import seed_acceptance

    assert not any(engine.telemetry().speculation.num_reached_per_pos), "runs before any test generates"
    engine.set_policy("adaptive")
    accepted, reached = [90.0, 81.0, 72.9, 65.6], [100.0, 90.0, 81.0, 72.9]  # peers at 0.9 per position
    seed_acceptance(engine.llm, accepted, reached)
    seeded = engine.telemetry()
    assert list(seeded.acceptance_ema.reached_per_pos) == reached
    assert seeded.acceptance_ema.per_pos == pytest.approx([0.9] * 4, abs=0.01)
    assert seeded.policy.info["alpha_0"] == pytest.approx(0.9, abs=0.01)
    engine.set_policy("fixed:k=4")
    engine.generate(max_tokens=16)
    drafted = engine.telemetry()
    seed_acceptance(engine.llm, [0.0] * 4, [1000.0] * 4)  # would drag every estimate to 0 if taken
    assert engine.telemetry().acceptance_ema.per_pos == drafted.acceptance_ema.per_pos


def test_greedy_output_is_identical_whatever_k(engine):
    outputs = {}
    for spec in ("fixed:k=0", "fixed:k=4", "cycle:ks=4-0-2-1-3-0-0-4", "goodput"):
        engine.set_policy(spec)
        outputs[spec] = engine.generate(max_tokens=40)
    reference = outputs["fixed:k=0"]
    for spec, tokens in outputs.items():
        assert tokens == reference, f"{spec} changed the greedy output"


def test_cycle_policy_really_varies_k(engine):
    engine.set_policy("cycle:ks=4-0-2")
    before = engine.telemetry()
    engine.generate(max_tokens=30)
    steps = delta(engine.telemetry().speculation.num_steps_by_k, before.speculation.num_steps_by_k)
    assert steps[0] > 0 and steps[2] > 0 and steps[4] > 0
    assert steps[1] == steps[3] == 0


def test_k_set_at_run_time_applies_from_the_next_step(engine):
    engine.set_policy("fixed:k=4")
    engine.generate(max_tokens=16)
    assert engine.set_policy("fixed:k=2") == "fixed:k=2"
    before = engine.telemetry()
    engine.generate(max_tokens=32)
    after = engine.telemetry()
    drafted = delta(after.speculation.num_drafted_per_pos, before.speculation.num_drafted_per_pos)
    steps = delta(after.speculation.num_steps_by_k, before.speculation.num_steps_by_k)
    assert after.policy.k == 2 and after.policy.spec == "fixed:k=2"
    assert steps[2] == sum(steps), "every step after the switch ran at k=2"
    # Drafts made at k=4 before the switch are cut to 2: positions 2 and 3 are never verified again.
    assert drafted[0] > 0 and drafted[1] > 0 and drafted[2] == drafted[3] == 0
    # Every speculating request verifies exactly k drafts per step (none run short here).
    assert drafted[1] == drafted[0]


def test_k0_is_a_real_non_speculative_step(engine):
    engine.set_policy("fixed:k=0")
    before = engine.telemetry()
    tokens = engine.generate(max_tokens=24)
    after = engine.telemetry()
    assert delta(after.speculation.num_drafted_per_pos, before.speculation.num_drafted_per_pos) == [0, 0, 0, 0]
    steps = delta(after.speculation.num_steps_by_k, before.speculation.num_steps_by_k)
    assert steps[0] == sum(steps) > 0
    assert after.speculation.num_emitted_tokens - before.speculation.num_emitted_tokens == sum(len(t) for t in tokens)


def test_per_position_counters_agree_with_vllm_totals(engine):
    engine.set_policy("fixed:k=4")
    engine.generate(max_tokens=40)
    ours = engine.telemetry()
    vllm = engine.vllm_counters()
    assert sum(ours.speculation.num_drafted_per_pos) == vllm["vllm:spec_decode_num_draft_tokens"].value
    assert sum(ours.speculation.num_accepted_per_pos) == vllm["vllm:spec_decode_num_accepted_tokens"].value
    assert ours.speculation.num_drafted_per_pos[0] == vllm["vllm:spec_decode_num_drafts"].value
    assert list(ours.speculation.num_accepted_per_pos) == vllm["vllm:spec_decode_num_accepted_tokens_per_pos"].values


def test_trained_pair_acceptance_at_position_0(engine):
    engine.set_policy("fixed:k=4")
    before = engine.telemetry()
    engine.generate(max_tokens=64)
    after = engine.telemetry()
    accepted = delta(after.speculation.num_accepted_per_pos, before.speculation.num_accepted_per_pos)
    drafted = delta(after.speculation.num_drafted_per_pos, before.speculation.num_drafted_per_pos)
    assert accepted[0] / drafted[0] >= 0.4


def test_bad_policy_is_refused_and_the_old_one_kept(engine):
    engine.set_policy("fixed:k=1")
    for bad in ("nope", "fixed:k=9", "goodput:max_k=x"):
        with pytest.raises(Exception, match="nope|max_k|k_max"):
            engine.set_policy(bad)
    assert engine.telemetry().policy.spec == "fixed:k=1"
    assert len(engine.generate(max_tokens=8)[0]) == 8


def test_the_policys_own_time_is_measured_inside_the_engine(engine):
    import time

    engine.set_policy("adaptive")
    before = engine.telemetry()
    started = time.monotonic()
    engine.generate(max_tokens=32)
    wall_s = time.monotonic() - started
    after = engine.telemetry()
    policy_s = after.speculation.policy_s - before.speculation.policy_s
    # Every step asks the policy twice (choose, observe), so the time is positive, and it is part of the
    # steps' wall time, so it is below the whole generation's.
    assert after.speculation.num_steps > before.speculation.num_steps
    assert 0 < policy_s < wall_s
    # Its CPU time on the EngineCore's thread is part of that time (the clocks' resolutions apart).
    policy_cpu_s = after.speculation.policy_cpu_s - before.speculation.policy_cpu_s
    assert 0 < policy_cpu_s <= policy_s + 1e-3


def test_a_policy_set_at_run_time_starts_from_the_steps_the_engine_ran(engine):
    from specserve.speculation import EngineTraits, make_policy

    before = engine.telemetry()
    for k in (2, 4):  # adaptive takes step costs only from steps at two k or more
        engine.set_policy(f"fixed:k={k}")
        engine.generate(max_tokens=64)
    after = engine.telemetry()
    engine.set_policy("adaptive")
    warm = engine.telemetry().policy.info
    cold = make_policy("adaptive", EngineTraits(max_k=after.policy.max_k)).describe()
    # Before adaptive has chosen a single k, its step-cost fit and acceptance are the engine's, not its prior.
    assert warm["latency_intercept_s"] != cold["latency_intercept_s"]
    accepted = delta(after.speculation.num_accepted_per_pos, before.speculation.num_accepted_per_pos)
    drafted = delta(after.speculation.num_drafted_per_pos, before.speculation.num_drafted_per_pos)
    assert warm["alpha_0"] == pytest.approx(accepted[0] / drafted[0], abs=0.1)
    # Asked to start cold (the simulator-vs-engine check's runs), it starts from its priors, as in a fresh engine.
    engine.set_policy("adaptive", warm_start=False)
    assert engine.telemetry().policy.info == cold
