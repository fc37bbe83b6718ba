"""Engine tier: k = 0 decode steps skip the draft pass, losslessly, and lagging requests draft nothing."""

from __future__ import annotations

import pytest
from engine_helpers import PROMPTS, running_engine

LATER = [
    "def main():\n    args = ",
    "with open(filename) as f:\n",
    "import json\n\ndef load(",
    "while True:\n    line = ",
]


@pytest.fixture(scope="module")
def engine(trained_pair):
    with running_engine(trained_pair, policy="fixed:k=0") as engine:
        yield engine


def delta(after, before):
    return [a - b for a, b in zip(after, before, strict=True)]


def test_engine_reports_that_k0_skips_the_draft_pass(engine):
    assert engine.telemetry().max_k == 4
    counts = engine.draft_pass_counts()
    assert set(counts) == {"skipped", "ran"}


def test_k0_decode_steps_skip_the_draft_and_are_counted(engine):
    engine.set_policy("fixed:k=0")
    before, worker_before = engine.telemetry(), engine.draft_pass_counts()
    engine.generate(max_tokens=24)
    after, worker_after = engine.telemetry(), engine.draft_pass_counts()
    steps = after.num_steps - before.num_steps
    skipped = after.num_steps_draft_skipped - before.num_steps_draft_skipped
    ran = worker_after["ran"] - worker_before["ran"]
    # Only the steps that prefill the four prompts run the draft; they usually share one step, but the engine
    # may start stepping before the last prompt reaches it. Every other step is a k=0 decode and skips.
    assert worker_after["skipped"] - worker_before["skipped"] == skipped, "the worker skipped what was counted"
    assert skipped + ran == steps and 1 <= ran <= len(PROMPTS)
    assert skipped >= 24 - len(PROMPTS), "24 tokens each: at least 20 decode-only steps"


@pytest.mark.parametrize("cycle", ["cycle:ks=4-4-0-0-0-0-0-0-4-4-4-4", "cycle:ks=4-0-2-1-3-0-0-4"])
def test_greedy_output_is_unchanged_through_long_k0_stretches(engine, cycle):
    engine.set_policy("fixed:k=0")
    reference = engine.generate(max_tokens=48)
    engine.set_policy(cycle)
    before, worker_before = engine.telemetry(), engine.draft_pass_counts()
    assert engine.generate(max_tokens=48) == reference
    after, worker_after = engine.telemetry(), engine.draft_pass_counts()
    skipped = after.num_steps_draft_skipped - before.num_steps_draft_skipped
    k0_steps = after.num_steps_by_k[0] - before.num_steps_by_k[0]
    # Every k=0 step skipped the pass but the prefill step, which runs the draft whatever k (the
    # cycle's position when the prompts arrive is not fixed, so that step may be at k=0 or not).
    assert k0_steps - 1 <= skipped <= k0_steps and skipped > 0
    assert worker_after["skipped"] - worker_before["skipped"] == skipped
    # Runs of consecutive k=0 steps leave holes: those requests drafted nothing afterwards.
    assert after.num_drafts_cut_for_lag > before.num_drafts_cut_for_lag


def test_resuming_speculation_mid_generation(engine, trained_pair):
    """Requests A decode at k=0 for 40 tokens; then k=4 and requests B arrive. A's draft KV has a
    39-step hole, so A drafts nothing; B speculate at once with the acceptance of an engine that
    never skipped; every output equals plain decoding's."""
    plan = dict(switch_after=40, max_tokens=80)
    plain, _ = engine.staggered(PROMPTS, LATER, before="fixed:k=0", after="fixed:k=0", **plan)
    before, worker_before = engine.telemetry(), engine.draft_pass_counts()
    tokens, gains = engine.staggered(PROMPTS, LATER, before="fixed:k=0", after="fixed:k=4", **plan)
    after, worker_after = engine.telemetry(), engine.draft_pass_counts()
    assert tokens == plain, "skipping and resuming changed the greedy output"
    assert (
        worker_after["skipped"] - worker_before["skipped"]
        == after.num_steps_draft_skipped - before.num_steps_draft_skipped
        >= 39
    )
    # Lagging requests draft nothing: one token per step, and their draft lists were cut (counted).
    for i in range(len(PROMPTS)):
        assert set(gains[f"a{i}"]) == {1}
    assert after.num_drafts_cut_for_lag - before.num_drafts_cut_for_lag >= len(PROMPTS)
    # B's acceptance (the only drafts verified after the switch) vs B alone on a never-skipping k=4.
    drafted = delta(after.num_drafted_per_pos, before.num_drafted_per_pos)
    accepted = delta(after.num_accepted_per_pos, before.num_accepted_per_pos)
    engine.set_policy("fixed:k=4")
    base_before = engine.telemetry()
    engine.generate(LATER, max_tokens=80)
    base_after = engine.telemetry()
    assert base_after.num_steps_draft_skipped == base_before.num_steps_draft_skipped
    base_drafted = delta(base_after.num_drafted_per_pos, base_before.num_drafted_per_pos)
    base_accepted = delta(base_after.num_accepted_per_pos, base_before.num_accepted_per_pos)
    for pos in range(4):
        ours, base = accepted[pos] / drafted[pos], base_accepted[pos] / base_drafted[pos]
        # Equal up to bf16 batch-composition noise; a draft on stale KV would lose points at every position.
        assert ours == pytest.approx(base, abs=0.05), f"position {pos}: {ours:.3f} vs never-skipped {base:.3f}"
    assert accepted[0] / drafted[0] >= 0.4


def test_skipping_can_be_turned_off(trained_pair):
    with running_engine(trained_pair, policy="cycle:ks=4-4-0-0-0-4-4", skip_k0_draft_pass=False) as engine:
        engine.set_policy("fixed:k=0")
        reference = engine.generate(max_tokens=32)
        engine.set_policy("cycle:ks=4-4-0-0-0-4-4")
        assert engine.generate(max_tokens=32) == reference
        telemetry, counts = engine.telemetry(), engine.draft_pass_counts()
        assert telemetry.num_steps_draft_skipped == telemetry.num_drafts_cut_for_lag == counts["skipped"] == 0
        assert counts["ran"] == telemetry.num_steps > 0
