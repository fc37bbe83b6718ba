"""Engine tier: the draft's confidence and entropy per drafted token reach the policy on the real engine, and a
policy's confidence rule cuts the drafts to their confident prefix before verification, losslessly."""

from __future__ import annotations

import pytest
from engine_helpers import running_engine


@pytest.fixture(scope="module")
def engine(shared_engine):  # its policy modules include signal_policies
    return shared_engine


def test_the_policy_sees_a_confidence_per_verified_draft_and_it_tells_accepted_from_rejected(engine):
    engine.set_policy("test-signal-recorder:k=4", warm_start=False)  # its own steps only
    engine.generate(max_tokens=64)
    seen = engine.telemetry().policy.info
    assert seen["misaligned"] == 0
    assert seen["accepted_n"] > 20 and seen["rejected_n"] > 20
    accepted, rejected = seen["accepted"] / seen["accepted_n"], seen["rejected"] / seen["rejected_n"]
    assert 0.0 < rejected < accepted <= 1.0
    assert seen["entropy_min"] >= 0.0


def test_a_confidence_threshold_verifies_only_the_confident_prefix_and_the_output_is_unchanged(engine):
    before, full, cut = engine.against_fixed_k("test-threshold:k=4,threshold=0.9")
    assert full.speculation.num_drafts_cut_by_confidence == before.speculation.num_drafts_cut_by_confidence
    assert cut.speculation.num_drafts_cut_by_confidence > full.speculation.num_drafts_cut_by_confidence
    # Fewer drafts reach verification at the deep positions.
    drafted = [
        a - b for a, b in zip(cut.speculation.num_drafted_per_pos, full.speculation.num_drafted_per_pos, strict=True)
    ]
    base = [
        a - b for a, b in zip(full.speculation.num_drafted_per_pos, before.speculation.num_drafted_per_pos, strict=True)
    ]
    assert drafted[3] / drafted[0] < base[3] / base[0]


def test_an_engine_asked_for_no_signals_computes_none_and_cuts_nothing(trained_pair):
    with running_engine(
        trained_pair, policy="fixed:k=0", policy_modules=("signal_policies",), draft_signals=False
    ) as engine:
        reference = engine.generate(max_tokens=32)
        engine.set_policy("test-signal-recorder:k=4")
        assert engine.generate(max_tokens=32) == reference
        seen = engine.telemetry().policy.info
        assert seen["accepted_n"] == seen["rejected_n"] == 0
        engine.set_policy("test-threshold:k=4,threshold=0.9")
        assert engine.generate(max_tokens=32) == reference
        assert engine.telemetry().speculation.num_drafts_cut_by_confidence == 0


@pytest.mark.parametrize("policy", ["adaptive", "slo", "mlp"])
def test_confidence_policies_keep_greedy_output(engine, policy):
    engine.set_policy("fixed:k=0")
    reference = engine.generate(max_tokens=40)
    engine.set_policy(policy)
    assert engine.generate(max_tokens=40) == reference
    info = engine.telemetry().policy.info
    if policy == "slo":
        assert info["mean_confidence"] != pytest.approx(0.6)  # moved off its prior: confidences arrived
