"""An engine's step log replayed through a fresh policy (``speculation.step_log``, ``experiments.policy_replay``)."""

from __future__ import annotations

import random

import pytest
from speculation_synthetic import make_record

from lab.experiments.policy_replay import replay_run, runs, trace_prices, warm_policy
from specserve.speculation import EngineTraits, StepContext, make_policy, step_log

TRAITS = EngineTraits(max_k=4, k0_runs_draft_pass=False, resume_s_per_token=1e-5, verifies_confident_prefix=True)
CPU_STEP = (5e-3, 1e-6, 5e-4, 1e-3, 1e-5)


def engine_log(policies: list[tuple[str, int]], seed: int = 0) -> list[str]:
    """What an engine would write: each (spec, steps) run chooses k with its own policy instance, switched in turn
    as ``specserve policy set`` switches (warm-started on the engine's steps so far), the load moving between
    one request and a full batch so that k changes."""
    rng = random.Random(seed)
    lines, history, now = [], [], 0.0
    for spec, num_steps in policies:
        policy = make_policy(spec, TRAITS)
        policy.warm_start(history[-1024:])
        for step in range(num_steps):
            batch = 1 if (step // 60) % 2 == 0 else 12
            ctx = StepContext(now_s=now, num_running=batch, num_waiting=0, num_context_tokens=batch * 80)
            k = policy.choose(ctx).k
            record = make_record(
                rng,
                CPU_STEP,
                now_s=now,
                k=k,
                num_running=batch,
                alpha=0.6,
                num_context_tokens=batch * 80,
                k0_runs_draft_pass=False,
            )
            policy.observe(record)
            history.append(record)
            lines.append(step_log.encode("1234", policy.spec, TRAITS, ctx, record))
            now += record.duration_s
    return lines


def test_a_logged_step_decodes_to_what_was_encoded() -> None:
    ctx = StepContext(now_s=1.5, num_running=2, num_waiting=1, num_context_tokens=90, request_ids=("a", "b"))
    record = make_record(random.Random(1), CPU_STEP, now_s=1.5, k=3, num_running=2, alpha=0.7, num_context_tokens=90)
    logged = step_log.decode(step_log.encode("7", "fixed:k=3", TRAITS, ctx, record))
    assert (logged.engine, logged.policy, logged.traits, logged.ctx, logged.record) == (
        "7",
        "fixed:k=3",
        TRAITS,
        ctx,
        record,
    )


def test_replaying_a_log_chooses_every_k_the_engine_chose() -> None:
    steps = list(step_log.read(engine_log([("fixed:k=3", 150), ("adaptive", 400), ("goodput", 200)])))
    specs = [
        (make_policy(spec, TRAITS).spec, n) for spec, n in (("fixed:k=3", 150), ("adaptive", 400), ("goodput", 200))
    ]
    assert [(steps[a].policy, b - a) for a, b in runs(steps)] == specs
    for start, stop in runs(steps):
        replay = replay_run(steps, start, stop)
        assert replay.num_agreeing == replay.num_steps
    adaptive = replay_run(steps, *runs(steps)[1])
    assert set(adaptive.by_batch) == {1, 12}
    assert len({k for row in adaptive.by_batch.values() for k in row.engine_k}) > 1, "the load should move k"
    for row in adaptive.by_batch.values():
        assert row.predicted_s is not None and len(row.predicted_s) == TRAITS.max_k + 1


def test_a_replay_without_the_warm_start_can_disagree() -> None:
    # The warm start matters: a policy that starts cold after a long fixed run prices the steps differently.
    steps = list(step_log.read(engine_log([("fixed:k=4", 600), ("adaptive", 300)], seed=3)))
    start, stop = runs(steps)[1]
    assert replay_run(steps, start, stop).num_agreeing == stop - start
    assert replay_run(steps, start, stop, warm_steps=0).num_agreeing < stop - start


def test_a_line_that_is_not_a_step_is_an_error() -> None:
    with pytest.raises((ValueError, KeyError)):
        list(step_log.read(['{"engine": "1"}']))


def test_loading_a_file_that_is_not_a_step_log_names_it(tmp_path) -> None:
    with pytest.raises(ValueError, match="is not a file"):
        step_log.load(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"engine": "1"}\n')
    with pytest.raises(ValueError, match=f"{bad} is not a step log"):
        step_log.load(bad)
    good = tmp_path / "good.jsonl"
    good.write_text("\n".join(engine_log([("fixed:k=2", 5)])) + "\n")
    assert [s.record.k for s in step_log.load(good)] == [2] * 5


def test_a_price_trace_splits_what_adaptive_charged_each_k_at_one_batch_size() -> None:
    steps = list(step_log.read(engine_log([("fixed:k=3", 150), ("adaptive", 400)])))
    start, stop = runs(steps)[1]
    rows = trace_prices(steps, start, stop, batch=12, every=20)
    at_batch = [i for i, s in enumerate(steps[start:stop]) if s.ctx.num_running == 12]
    assert [row.step for row in rows] == at_batch[::20]
    # The parts multiply back to what the policy charged the decodes at that step, replayed to there.
    policy = warm_policy(steps, start)
    charged = {}
    for index, logged in enumerate(steps[start:stop]):
        if index in {row.step for row in rows}:
            charged[index] = policy.decode_seconds_all(logged.ctx)
        policy.choose(logged.ctx)
        policy.observe(logged.record)
    for row in rows:
        assert len(row.model_ms) == len(row.factors) == TRAITS.max_k + 1
        assert [m * f / 1e3 for m, f in zip(row.model_ms, row.factors, strict=True)] == pytest.approx(
            list(charged[row.step])
        )
        assert len(row.alphas) == TRAITS.max_k and all(0.0 <= a <= 1.0 for a in row.alphas)
    assert rows[-1].alphas != rows[0].alphas, "the acceptance estimate should learn over the run"


def test_a_policy_without_a_step_cost_fit_has_no_price_trace() -> None:
    steps = list(step_log.read(engine_log([("fixed:k=3", 50)])))
    with pytest.raises(ValueError, match="no step-cost fit"):
        trace_prices(steps, 0, 50, batch=1)
    with pytest.raises(ValueError, match="every=0"):
        trace_prices(steps, 0, 50, batch=1, every=0)
