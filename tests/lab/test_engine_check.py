"""engine-check's pure parts: the CPU step-time fit, acceptance from the engine's rates, the trace, windows."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lab.experiments.engine_check import (
    OUTPUT_TOKENS,
    PROMPT_TOKENS,
    SEGMENTS,
    SETUPS,
    PolicyCheck,
    RunSummary,
    acceptance_from,
    fit_cpu_timer,
    k_worth,
    make_trace,
    mean_summary,
    rate_errors,
    run_order,
    simulate_trace,
    summarize_run,
    worth_ratios,
    write_trace,
)
from specserve.sim.config import AcceptanceConfig
from specserve.sim.latency import LinearForward, StepTimer


def _step(
    k: int, batch: int, context: int, overhead=2e-3, per_token=8e-5, per_pass=1e-3, per_draft_token=5e-5, spec=1.5e-3
):
    passes = k  # k = 0 decode steps skip the pass
    batched = batch * (k + 1)
    draft_tokens = (batched if passes else 0) + max(passes - 1, 0) * batch
    duration = overhead + per_token * batched + passes * per_pass + per_draft_token * draft_tokens + spec * (k > 0)
    return {
        "k": k,
        "num_running": batch,
        "num_context_tokens": context,
        "num_batched_tokens": batched,
        "num_draft_passes": passes,
        "duration_s": duration,
    }


def test_the_fit_recovers_the_step_time_model_that_made_the_log() -> None:
    log = [_step(k, b, c) for k in range(5) for b in (1, 2, 4, 8) for c in (50, 300, 1000)]
    fit = fit_cpu_timer(log)
    timer = fit.timer
    assert fit.error < 1e-6
    assert not fit.on_parts, "a log without timed parts is fitted on whole steps"
    assert timer.step_overhead_s == pytest.approx(2e-3, rel=1e-4)
    assert timer.target.s_per_batched_token == pytest.approx(8e-5, rel=1e-4)
    assert timer.draft.intercept_s == pytest.approx(1e-3, rel=1e-4)
    assert timer.draft.s_per_batched_token == pytest.approx(5e-5, rel=1e-4)
    assert timer.speculation_overhead_s == pytest.approx(1.5e-3, rel=1e-4)
    assert timer.jitter_sigma == pytest.approx(0.0, abs=1e-6), "an exact log leaves no spread to draw"
    for e in log:
        passes = [e["num_batched_tokens"]] + [e["num_running"]] * (e["num_draft_passes"] - 1) if e["k"] else []
        step_s = timer.step_s(e["num_context_tokens"], e["num_batched_tokens"], passes, verifies=e["k"] > 0)
        assert step_s == pytest.approx(e["duration_s"])


def _timed(
    e: dict, forward_intercept=1e-3, per_context=2e-6, per_token=8e-5, per_pass=1e-3, per_draft_token=5e-5
) -> dict:
    """A step of ``_step``'s shape whose parts the engine timed: the target's pass (with a fixed cost of its own,
    which ``_step``'s whole-step overhead holds) and the draft's passes; the rest is the step less both."""
    passes = e["num_draft_passes"]
    draft_tokens = (e["num_batched_tokens"] if passes else 0) + max(passes - 1, 0) * e["num_running"]
    forward = forward_intercept + per_context * e["num_context_tokens"] + per_token * e["num_batched_tokens"]
    draft = passes * per_pass + per_draft_token * draft_tokens
    rest = 1e-3 + 1.5e-3 * (e["k"] > 0)
    return {**e, "forward_s": forward, "draft_s": draft, "duration_s": forward + draft + rest}


def _shape(e: dict) -> tuple[float, float, list[float]]:
    passes = e["num_draft_passes"]
    return (
        e["num_context_tokens"],
        e["num_batched_tokens"],
        [e["num_batched_tokens"]] + [e["num_running"]] * (passes - 1),
    )


def test_timed_parts_identify_what_a_further_k_costs_from_steps_at_one_k() -> None:
    """Held at one k, a draft pass's cost moves with the step's fixed cost: whole steps cannot tell them apart,
    the draft's own timing can. Trained on k = 2 alone, the parts fit prices a k = 4 step as the engine runs it."""
    at_k2 = [_timed(_step(2, b, c)) for b in (1, 2, 4, 8) for c in (50, 300, 1000)]
    at_k4 = [_timed(_step(4, b, c)) for b in (1, 2, 4, 8) for c in (50, 300, 1000)]
    parts = fit_cpu_timer(at_k2)
    assert parts.on_parts
    assert parts.timer.draft.intercept_s == pytest.approx(1e-3, rel=1e-4)
    assert parts.timer.target.intercept_s == pytest.approx(1e-3, rel=1e-4)
    assert parts.timer.target.s_per_context_token == pytest.approx(2e-6, rel=1e-4)
    whole = fit_cpu_timer(at_k2, use_parts=False)
    assert not whole.on_parts and whole.parts_timed

    def miss(timer: StepTimer) -> float:
        """The largest relative error over the k = 4 steps."""
        return max(abs(timer.step_s(*_shape(e), verifies=True) / e["duration_s"] - 1) for e in at_k4)

    assert miss(parts.timer) < 1e-6
    assert miss(whole.timer) > 0.02, "the whole-step fit cannot know a pass's cost from one k"


def test_a_log_with_some_steps_untimed_is_fitted_whole() -> None:
    log = [_timed(_step(k, b, 300)) for k in range(5) for b in (1, 4)]
    log[3] = {**log[3], "forward_s": None}
    assert not fit_cpu_timer(log).on_parts


def test_the_fit_takes_the_spread_of_the_steps_around_it_as_the_simulators_jitter() -> None:
    rng = np.random.default_rng(0)
    sigma = 0.2
    log = [_step(k, b, c) for k in range(5) for b in (1, 2, 4, 8) for c in (50, 300, 1000) for _ in range(40)]
    noisy = [{**e, "duration_s": e["duration_s"] * rng.lognormal(-(sigma**2) / 2, sigma)} for e in log]
    timer = fit_cpu_timer(noisy).timer
    # 2,400 draws: the sample log-sigma is within a few percent of the one that made them.
    assert timer.jitter_sigma == pytest.approx(sigma, rel=0.1)
    assert timer.step_overhead_s == pytest.approx(2e-3, rel=0.2)


def test_a_slow_tail_raises_the_fits_level_to_the_mean_step_and_leaves_its_shape() -> None:
    """One step in ten stalled to three times its cost: relative-error least squares alone fits the typical step
    (about 1.02 x the model here), a fifth under the mean one (1.2 x), and the simulator would run the trace
    faster than the engine did."""
    log = [_step(k, b, c) for k in range(5) for b in (1, 2, 4, 8) for c in (50, 300, 1000) for _ in range(10)]
    stalled = [{**e, "duration_s": e["duration_s"] * (3.0 if i % 10 == 0 else 1.0)} for i, e in enumerate(log)]
    timer = fit_cpu_timer(stalled).timer
    assert timer.step_overhead_s == pytest.approx(1.2 * 2e-3, rel=1e-6)
    assert timer.target.s_per_batched_token == pytest.approx(1.2 * 8e-5, rel=1e-6)
    assert timer.draft.intercept_s == pytest.approx(1.2 * 1e-3, rel=1e-6)
    assert timer.speculation_overhead_s == pytest.approx(1.2 * 1.5e-3, rel=1e-6)


def test_jitter_has_mean_one_and_is_off_at_zero() -> None:
    timer = StepTimer(LinearForward(0.0, 1e-4, 0.0), LinearForward(0.0, 1e-5, 0.0), 1e-3)
    rng = np.random.default_rng(1)
    assert {timer.jitter(rng) for _ in range(100)} == {1.0}
    draws = np.array([dataclasses.replace(timer, jitter_sigma=0.3).jitter(rng) for _ in range(20_000)])
    # Standard error of the mean: 0.3 / sqrt(20000) = 0.002.
    assert draws.mean() == pytest.approx(1.0, abs=0.01)
    assert np.log(draws).std() == pytest.approx(0.3, rel=0.05)


def test_a_jittered_simulation_is_reproducible_and_the_jitter_moves_only_step_times(tmp_path) -> None:
    setup = SETUPS["perf-S"]
    trace = write_trace(make_trace(0, [(d / 5, r) for d, r in setup.segments]), tmp_path / "trace.csv")
    steady = StepTimer(LinearForward(1e-8, 4e-5, 0.0), LinearForward(4e-7, 0.0, 4e-4), 2e-3)
    jittery = dataclasses.replace(steady, jitter_sigma=0.3)
    acceptance = AcceptanceConfig(mean=0.8, concentration=None)

    def run(timer: StepTimer, seed: int) -> tuple[list, float]:
        steps, makespan, _ = simulate_trace(trace, timer, acceptance, "fixed:k=0", 4, setup, seed)
        return [(e["now_s"], e["k"], e["num_emitted_tokens"]) for e in steps], makespan

    assert run(jittery, 3) == run(jittery, 3)
    assert run(jittery, 3) != run(jittery, 4)
    # At k = 0 no acceptance is drawn: without jitter two seeds run the very same steps.
    assert run(steady, 3) == run(steady, 4)
    steps_steady, steps_jittery = run(steady, 3)[0], run(jittery, 3)[0]
    assert sum(n for _, _, n in steps_steady) == sum(n for _, _, n in steps_jittery), "the same tokens"
    assert [t for t, _, _ in steps_steady] != [t for t, _, _ in steps_jittery]


def test_acceptance_takes_position_0_and_a_geometric_decay_from_falling_conditional_rates() -> None:
    acc = acceptance_from([100, 80, 60, 40], [80, 64 * 0.9, 48 * 0.81, 32 * 0.729])
    assert acc.mean == pytest.approx(0.8)
    assert acc.decay == pytest.approx(0.9)
    assert acc.concentration is None
    assert acc.signals.enabled  # the check turns them off when it builds its scenario
    assert acceptance_from([0, 0], [0, 0]).mean == 0.5


@pytest.mark.parametrize("concentration", [2.0, 12.0, 60.0])
def test_rising_conditional_rates_give_back_the_spread_of_alphas_across_requests(concentration) -> None:
    # Requests' alphas ~ Beta(0.6 c, 0.4 c): of the drafts that reach position j, E[a^(j+1)] / E[a^j] are accepted.
    rng = np.random.default_rng(0)
    alphas = rng.beta(0.6 * concentration, 0.4 * concentration, size=200_000)
    reached = [float(np.sum(alphas**j)) for j in range(4)]
    accepted = [float(np.sum(alphas ** (j + 1))) for j in range(4)]
    acc = acceptance_from(reached, accepted)
    assert acc.mean == pytest.approx(0.6, abs=0.01) and acc.decay == 1.0
    assert acc.concentration == pytest.approx(concentration, rel=0.15)


def test_flat_conditional_rates_mean_every_request_alike() -> None:
    acc = acceptance_from([1000, 600, 360], [600, 360, 216])
    assert acc.mean == pytest.approx(0.6) and acc.concentration is None and acc.decay == 1.0


def test_the_trace_is_seeded_and_its_middle_segment_is_the_busiest() -> None:
    rows = make_trace(0)
    assert rows == make_trace(0) and rows != make_trace(1)
    (d0, _), (d1, _), _ = SEGMENTS
    counts = [sum(lo <= r.arrival_s < hi for r in rows) for lo, hi in ((0, d0), (d0, d0 + d1), (d0 + d1, 1e9))]
    assert counts[1] > 5 * max(counts[0], counts[2])


def test_windows_average_k_and_skip_empty_ones() -> None:
    steps = [{"t_s": 0.5, "k": 2, "num_emitted_tokens": 3}, {"t_s": 1.0, "k": 4, "num_emitted_tokens": 5}]
    run = summarize_run(steps, makespan_s=4.0, horizon_s=10.0)
    assert run.throughput_tok_s == 2.0
    assert run.k_by_window[0] == 3.0 and run.k_by_window[1] != run.k_by_window[1]  # nan


def test_a_slowed_trace_keeps_its_shape_relative_to_the_machine() -> None:
    setup = SETUPS["perf-S"]
    slowed = setup.slowed(4.0)
    assert [(d * 4.0, r / 4.0) for d, r in setup.segments] == list(slowed.segments)
    # The same expected number of requests per segment, over four times the span.
    assert [d * r for d, r in setup.segments] == pytest.approx([d * r for d, r in slowed.segments])
    assert slowed.slowed(0.5).slowdown == 2.0 and slowed.prefix == setup.prefix
    with pytest.raises(ValueError, match="slowdown"):
        setup.slowed(0.0)


def test_a_windows_k_is_worth_the_tokens_per_second_its_step_serves() -> None:
    timer = StepTimer(LinearForward(0.0, 1e-3, 0.0), LinearForward(0.0, 1e-4, 2e-3), 10e-3, speculation_overhead_s=1e-3)
    acceptance = AcceptanceConfig(mean=0.5, concentration=None)
    # k = 2 at batch 4: 12 target tokens, passes of 12 and 4 tokens; 1 + 0.5 + 0.25 tokens per request.
    step_s = 10e-3 + 12e-3 + 1e-3 + (2e-3 + 12e-4) + (2e-3 + 4e-4)
    assert k_worth(timer, acceptance, 2, batch=4, context=100) == pytest.approx(4 * 1.75 / step_s)
    assert k_worth(timer, acceptance, 0, batch=4, context=100) == pytest.approx(4 / (10e-3 + 4e-3))
    # A mean k between two integers is worth what the two are, in proportion.
    low, high = (k_worth(timer, acceptance, k, 4, 100) for k in (2, 3))
    assert k_worth(timer, acceptance, 2.25, 4, 100) == pytest.approx(0.75 * low + 0.25 * high)
    nan = float("nan")
    engine = RunSummary(1.0, 1.0, (2.0, 2.0, nan), batch_by_window=(4.0, 4.0, 4.0), context_by_window=(100.0,) * 3)
    check = PolicyCheck("adaptive", engine, RunSummary(1.0, 1.0, (2.0, 3.0, 1.0)), acceptance)
    assert worth_ratios(check, timer) == pytest.approx([1.0, high / low])  # the window the engine idled is skipped


def test_policies_that_choose_k_run_once_per_round_and_fixed_ones_once() -> None:
    order = run_order(["adaptive", "fixed:k=0", "bandit", "fixed:k=4"], rounds=3)
    assert order == ["adaptive", "fixed:k=0", "bandit", "fixed:k=4", "adaptive", "bandit", "adaptive", "bandit"]
    assert run_order(["adaptive", "fixed:k=2"], rounds=1) == ["adaptive", "fixed:k=2"]
    # Under a closed loop a fixed k's throughput moves from run to run: every policy runs every round.
    assert run_order(["adaptive", "fixed:k=2"], rounds=2, closed=True) == ["adaptive", "fixed:k=2"] * 2


def test_several_engine_runs_are_compared_by_their_mean_k_per_window() -> None:
    nan = float("nan")
    # Two runs that settled on different k of near-equal worth, the second idle in the last window.
    runs = (RunSummary(100.0, 10.0, (2.0, 2.0, 4.0)), RunSummary(120.0, 12.0, (4.0, 4.0, nan)))
    engine = mean_summary(runs, [1.0, 2.0, 3.0, 6.0])
    assert engine.k_by_window == (3.0, 3.0, 4.0)
    assert (engine.throughput_tok_s, engine.makespan_s, engine.mean_e2e_s) == (110.0, 11.0, 3.0)
    sim = RunSummary(110.0, 11.0, (3.0, 3.0, 4.0))
    check = PolicyCheck("adaptive", engine, sim, AcceptanceConfig(mean=0.7), runs)
    # Against the mean the simulator's k is exact; against either run alone it is a third to a half off.
    assert check.k_errors() == [0.0, 0.0, 0.0]
    assert check.k_error_each_run() == pytest.approx([(0.5 + 0.5 + 0.0) / 3, 0.25])


@pytest.mark.parametrize("pair", sorted(SETUPS))
def test_the_simulator_charges_the_speculating_step_cost_to_steps_that_verify_only(tmp_path, pair) -> None:
    setup = SETUPS[pair].slowed(0.2)
    trace = None if setup.closed else write_trace(make_trace(0, setup.segments), tmp_path / "trace.csv")
    plain = StepTimer(LinearForward(1e-8, 4e-5, 0.0), LinearForward(4e-7, 0.0, 4e-4), 2e-3)
    costly = dataclasses.replace(plain, speculation_overhead_s=5e-3)
    acceptance = AcceptanceConfig(mean=0.8, concentration=None)

    def throughput(timer: StepTimer, policy: str) -> float:
        steps, makespan, _ = simulate_trace(trace, timer, acceptance, policy, 4, setup)
        return summarize_run(steps, makespan, setup.horizon_s, closed=setup.closed).throughput_tok_s

    assert throughput(costly, "fixed:k=0") == throughput(plain, "fixed:k=0")
    assert throughput(costly, "fixed:k=2") < throughput(plain, "fixed:k=2")


def test_a_closed_loop_is_simulated_with_the_setups_clients_and_fixed_lengths() -> None:
    setup = SETUPS["perf-S-clients"].slowed(0.25)
    timer = StepTimer(LinearForward(1e-8, 4e-5, 0.0), LinearForward(4e-7, 0.0, 4e-4), 2e-3)
    _, _, result = simulate_trace(None, timer, AcceptanceConfig(mean=0.8), "fixed:k=2", 4, setup)
    table = result.table
    assert set(table.prompt_tokens.tolist()) == {PROMPT_TOKENS}
    assert set(table.output_tokens.tolist()) == {OUTPUT_TOKENS}
    (first, first_s), (peak, peak_s), _ = setup.phases

    def in_flight(t: float) -> int:
        return int(((table.arrival_s <= t) & (table.finish_s > t)).sum())

    # Before the rise the one client is never idle and never has two requests; amid the peak every seat is busy.
    assert {in_flight(t) for t in table.arrival_s.tolist() if t < first_s} == {first}
    assert in_flight(first_s + peak_s / 2) == peak
    assert max(in_flight(t) for t in table.arrival_s.tolist()) == peak
    assert table.arrival_s.max() < setup.horizon_s, "nothing is sent after the last phase"


def test_a_slowed_closed_loop_keeps_its_clients_over_longer_phases() -> None:
    setup = SETUPS["perf-S-clients"]
    slowed = setup.slowed(3.0)
    assert slowed.closed and slowed.segments == ()
    assert [(c, d * 3.0) for c, d in setup.phases] == list(slowed.phases)
    assert slowed.horizon_s == pytest.approx(3.0 * setup.horizon_s)
    assert slowed.schedule()(0.0)[0] == setup.phases[0][0]


def test_a_closed_loop_is_rated_on_the_steps_within_its_phases_and_pooled_runs_are_averaged() -> None:
    steps = [
        {"t_s": 0.5, "k": 2, "num_emitted_tokens": 30},
        {"t_s": 6.0, "k": 2, "num_emitted_tokens": 20},
        {"t_s": 9.9, "k": 2, "num_emitted_tokens": 10},
        {"t_s": 10.2, "k": 2, "num_emitted_tokens": 40},  # the drain
    ]
    closed = summarize_run(steps, makespan_s=10.5, horizon_s=10.0, closed=True)
    assert closed.throughput_tok_s == 6.0
    assert closed.rate_by_window == (6.0, 6.0)
    assert summarize_run(steps, makespan_s=10.5, horizon_s=10.0).throughput_tok_s == pytest.approx(100 / 10.5)
    # Two runs' steps pooled: per run, as one run of the same steps rates.
    pooled = summarize_run(steps + steps, makespan_s=21.0, horizon_s=10.0, closed=True, runs=2)
    assert (pooled.throughput_tok_s, pooled.rate_by_window) == (6.0, (6.0, 6.0))


def test_throughput_error_per_window_skips_windows_the_engine_did_not_serve() -> None:
    engine = RunSummary(1.0, 1.0, (), rate_by_window=(100.0, 0.0, 50.0))
    sim = RunSummary(1.0, 1.0, (), rate_by_window=(90.0, 5.0, 60.0))
    assert rate_errors(engine, sim) == pytest.approx([0.1, 0.2])
