"""Engine tier: k = 0 decode steps skip the draft pass, losslessly, and the draft catches up when k > 0 resumes."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import pytest
from engine_helpers import PERF_TINY, PROMPTS, running_engine

from specserve.models import make_pair, perf
from specserve.models.prompts import OPENINGS

LATER = list(OPENINGS[4:])


@pytest.fixture(scope="module")
def engine(shared_engine):
    return shared_engine


@pytest.fixture(scope="module")
def never_skipping(trained_pair):
    """vLLM as shipped: the draft runs at k = 0 too, so its KV never lags."""
    with running_engine(trained_pair, policy="fixed:k=0", skip_k0_draft_pass=False) as engine:
        yield engine


def delta(after, before):
    return [a - b for a, b in zip(after, before, strict=True)]


def test_engine_reports_that_k0_skips_the_draft_pass(engine):
    assert engine.telemetry().policy.max_k == 4
    counts = engine.draft_pass_counts()
    assert set(counts) == {
        "skipped", "ran", "caught_up", "catch_up_tokens", "proposals", "proposals_not_k", "plain_steps"
    }  # fmt: skip


def test_k0_decode_steps_skip_the_draft_and_are_counted(engine):
    engine.set_policy("fixed:k=0")
    before, worker_before = engine.telemetry(), engine.draft_pass_counts()
    engine.generate(max_tokens=24)
    after, worker_after = engine.telemetry(), engine.draft_pass_counts()
    steps = after.speculation.num_steps - before.speculation.num_steps
    skipped = after.speculation.num_steps_draft_skipped - before.speculation.num_steps_draft_skipped
    ran = worker_after["ran"] - worker_before["ran"]
    # Only the steps that prefill the four prompts run the draft; they usually share one step, but the engine
    # may start stepping before the last prompt reaches it. Every other step is a k=0 decode and skips.
    assert worker_after["skipped"] - worker_before["skipped"] == skipped, "the worker skipped what was counted"
    # A skipped step verifies no draft either: it samples as an engine without speculation does.
    assert worker_after["plain_steps"] - worker_before["plain_steps"] == skipped
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
    skipped = after.speculation.num_steps_draft_skipped - before.speculation.num_steps_draft_skipped
    k0_steps = after.speculation.num_steps_by_k[0] - before.speculation.num_steps_by_k[0]
    # Every k=0 step skipped the pass but the prefill step, which runs the draft whatever k (the
    # cycle's position when the prompts arrive is not fixed, so that step may be at k=0 or not).
    assert k0_steps - 1 <= skipped <= k0_steps and skipped > 0
    assert worker_after["skipped"] - worker_before["skipped"] == skipped
    # The first k = 0 step after k > 0 verifies the drafts made before it, through the rejection sampler; the rest
    # of a stretch samples as a plain engine.
    plain = worker_after["plain_steps"] - worker_before["plain_steps"]
    assert 0 < plain <= skipped
    # Each run of six k = 0 steps leaves five positions per request unwritten; the next pass caught every
    # request up over them (the budget has room for all), and both engine processes counted the same.
    caught_up = after.speculation.num_requests_caught_up - before.speculation.num_requests_caught_up
    catch_up_tokens = after.speculation.num_catch_up_tokens - before.speculation.num_catch_up_tokens
    assert caught_up == worker_after["caught_up"] - worker_before["caught_up"] > 0
    assert catch_up_tokens == worker_after["catch_up_tokens"] - worker_before["catch_up_tokens"]
    if cycle.startswith("cycle:ks=4-4-0-0-0-0-0-0"):
        # A full stretch leaves five positions; only a request's first stretch can be shorter, when its
        # prompt reached the engine core after the stretch began (offline prompts may arrive over steps).
        assert catch_up_tokens <= 5 * caught_up
        assert catch_up_tokens >= 5 * (caught_up - len(PROMPTS)) + len(PROMPTS)
    # Caught up before they drafted again, so no request's drafts had to be cut.
    assert after.speculation.num_drafts_cut_for_lag == before.speculation.num_drafts_cut_for_lag


def test_resuming_speculation_mid_generation(engine, never_skipping):
    """Requests A decode at k=0 for 40 tokens; then k=4 and requests B arrive. A's draft KV has a
    39-position hole, which the first pass at k=4 fills; from then A speculate with the acceptance of an
    engine that never skipped (the regression other engines shipped: acceptance collapsing after a
    stretch at draft length 0), B speculate at once, and every output equals plain decoding's."""
    plan = dict(switch_after=40, max_tokens=80)
    plain, _ = engine.staggered(PROMPTS, LATER, before="fixed:k=0", after="fixed:k=0", **plan)
    before, worker_before = engine.telemetry(), engine.draft_pass_counts()
    tokens, gains = engine.staggered(PROMPTS, LATER, before="fixed:k=0", after="fixed:k=4", **plan)
    after, worker_after = engine.telemetry(), engine.draft_pass_counts()
    assert tokens == plain, "skipping and resuming changed the greedy output"
    assert (
        worker_after["skipped"] - worker_before["skipped"]
        == after.speculation.num_steps_draft_skipped - before.speculation.num_steps_draft_skipped
        >= 39
    )
    assert after.speculation.num_requests_caught_up - before.speculation.num_requests_caught_up == len(PROMPTS)
    base_before = never_skipping.telemetry()
    base_tokens, base_gains = never_skipping.staggered(PROMPTS, LATER, before="fixed:k=0", after="fixed:k=4", **plan)
    base_after = never_skipping.telemetry()
    assert base_tokens == plain
    # A's tokens per step after the switch: 1 + accepted drafts. On a stale draft KV (no catch-up) they
    # fall; under the bare lag rule they would be exactly 1.
    for i in range(len(PROMPTS)):
        ours, base = (statistics.mean(g[-40:]) for g in (gains[f"a{i}"], base_gains[f"a{i}"]))
        assert ours > 1.2, f"a{i} does not speculate after resuming: {ours:.2f} tokens per step"
        assert ours == pytest.approx(base, rel=0.1), f"a{i}: {ours:.2f} tokens per step vs never-skipped {base:.2f}"
    drafted = delta(after.speculation.num_drafted_per_pos, before.speculation.num_drafted_per_pos)
    accepted = delta(after.speculation.num_accepted_per_pos, before.speculation.num_accepted_per_pos)
    base_drafted = delta(base_after.speculation.num_drafted_per_pos, base_before.speculation.num_drafted_per_pos)
    base_accepted = delta(base_after.speculation.num_accepted_per_pos, base_before.speculation.num_accepted_per_pos)
    for pos in range(4):
        ours, base = accepted[pos] / drafted[pos], base_accepted[pos] / base_drafted[pos]
        # Equal up to bf16 batch-composition noise; a draft on stale KV would lose points at every position.
        assert ours == pytest.approx(base, abs=0.05), f"position {pos}: {ours:.3f} vs never-skipped {base:.3f}"


@dataclass(frozen=True)
class Resumed:
    """One run of ``PROMPTS`` at k = 0 then k = 4 after ``switch_after`` tokens, beside its plain decoding."""

    plain: dict[str, list[int]]
    tokens: dict[str, list[int]]
    gains: dict[str, list[int]]
    caught_up: int  # requests caught up whole, as the scheduler counted them
    worker_caught_up: int  # the same, as the worker counted them
    catch_up_tokens: int
    drafts_cut_for_lag: int
    passes: list[int]  # catch-up tokens of each draft pass that caught something up


def resume(engine, **plan) -> Resumed:
    plain, _ = engine.staggered(PROMPTS, [], before="fixed:k=0", after="fixed:k=0", **plan)
    engine.llm.collective_rpc("specserve_propose_times")  # forget the passes so far
    before, worker_before = engine.telemetry(), engine.draft_pass_counts()
    tokens, gains = engine.staggered(PROMPTS, [], before="fixed:k=0", after="fixed:k=4", **plan)
    after, worker_after = engine.telemetry(), engine.draft_pass_counts()
    (passes,) = engine.llm.collective_rpc("specserve_propose_times")
    return Resumed(
        plain,
        tokens,
        gains,
        after.speculation.num_requests_caught_up - before.speculation.num_requests_caught_up,
        worker_after["caught_up"] - worker_before["caught_up"],
        after.speculation.num_catch_up_tokens - before.speculation.num_catch_up_tokens,
        after.speculation.num_drafts_cut_for_lag - before.speculation.num_drafts_cut_for_lag,
        [n for _, n, _ in passes if n > 0],
    )


def test_a_catch_up_cap_spreads_the_catch_up_over_steps_losslessly(trained_pair):
    """Four requests with 39-position holes against a cap of 16 tokens: each step's pass catches one of them up
    (the shortest lag goes whatever the cap), the others' drafts are cut until their turn, and outputs and the
    two processes' plans agree as without the cap."""
    with running_engine(trained_pair, policy="fixed:k=0", catch_up_max_tokens=16) as engine:
        run = resume(engine, switch_after=40, max_tokens=64)
    assert run.tokens == run.plain
    assert run.caught_up == run.worker_caught_up == len(PROMPTS)
    assert len(run.passes) == len(PROMPTS), "one request caught up per pass"
    assert sum(run.passes) == run.catch_up_tokens
    # Requests waiting for their turn drafted on a draft KV with a hole: those drafts were cut, not verified.
    assert run.drafts_cut_for_lag > 0
    # Once caught up, each speculates.
    for i in range(len(PROMPTS)):
        assert statistics.mean(run.gains[f"a{i}"][-16:]) > 1.2


def tail_tokens_per_step(gains: list[int], tokens: int) -> float:
    """Tokens per step over a request's last ``tokens`` output tokens (greedy runs of one prompt emit the same
    tokens, so two runs compare over the same positions, whatever their step boundaries)."""
    total, steps = 0, 0
    for gain in reversed(gains):
        if total >= tokens:
            break
        total, steps = total + gain, steps + 1
    return total / steps


def test_a_lag_longer_than_the_token_budget_is_caught_up_in_chunks(trained_pair):
    """A token budget of 48 and four 59-token holes: no hole fits a step whole, so each is caught up in chunks
    (the chunk replaces the request's own tokens in the draft's pass), and every request speculates again with
    outputs equal to plain decoding."""
    plan = dict(switch_after=60, max_tokens=160)
    with running_engine(trained_pair, policy="fixed:k=0", max_num_batched_tokens=48) as engine:
        run = resume(engine, **plan)
        _, speculating = engine.staggered(PROMPTS, [], before="fixed:k=4", after="fixed:k=4", **plan)
    assert run.tokens == run.plain
    assert run.caught_up == run.worker_caught_up == len(PROMPTS)
    assert len(run.passes) > len(PROMPTS), "some requests took more than one pass"
    assert max(run.passes) < 48  # every pass within the budget; no 59-token hole went whole
    for i in range(len(PROMPTS)):
        # Once caught up, a request speculates as one that never stopped does (a stale draft KV would lose tokens).
        ours, base = (tail_tokens_per_step(g[f"a{i}"], 60) for g in (run.gains, speculating))
        assert ours > 1.2, f"a{i} does not speculate after its catch-up"
        assert ours == pytest.approx(base, rel=0.1), f"a{i}: {ours:.2f} tokens per step vs {base:.2f} throughout"


def test_skipping_can_be_turned_off(never_skipping):
    engine = never_skipping
    engine.set_policy("fixed:k=0")
    reference = engine.generate(max_tokens=32)
    engine.set_policy("cycle:ks=4-4-0-0-0-4-4")
    assert engine.generate(max_tokens=32) == reference
    telemetry, counts = engine.telemetry(), engine.draft_pass_counts()
    assert (
        telemetry.speculation.num_steps_draft_skipped
        == telemetry.speculation.num_drafts_cut_for_lag
        == counts["skipped"]
        == 0
    )
    assert telemetry.speculation.num_requests_caught_up == counts["caught_up"] == 0
    assert counts["ran"] == telemetry.speculation.num_steps > 0
    assert counts["plain_steps"] == 0


def test_a_draft_in_the_targets_attention_group_decodes_through_k0(tmp_path, monkeypatch):
    """The perf pair's draft layers have the target's shapes, so vLLM puts both in one attention group. A plain
    step leaves out the draft's own groups only: this one holds the target's layers too."""
    monkeypatch.setitem(perf.PERF_SIZES, "S", PERF_TINY)
    pair = make_pair("perf", tmp_path, size="S", agreement=1.0, progress=False)
    with running_engine(pair, policy="fixed:k=0") as engine:
        reference = engine.generate(max_tokens=24)
        engine.set_policy("cycle:ks=4-0-0-0-2-0-0-4")
        before = engine.draft_pass_counts()
        assert engine.generate(max_tokens=24) == reference
        after = engine.draft_pass_counts()
    assert after["plain_steps"] > before["plain_steps"] and after["ran"] > before["ran"]
