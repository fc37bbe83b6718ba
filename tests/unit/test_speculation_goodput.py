"""GoodputPolicy: TurboSpec's ArgMaxGoodput (§4.2, Listing 2), learning from synthetic records.

Worked example of the objective (TurboSpec §3, Fig. 2): a step of 12.6 ms at k = 2 and alpha = 0.7 emits 2.19
tokens per request, 5.75 ms per token against 7.4 ms without speculation, so k = 2 beats k = 0 there.
"""

from __future__ import annotations

import random
from itertools import pairwise

import pytest
from speculation_synthetic import make_record, true_step_s, varied_records

from specserve.speculation import EngineTraits, GoodputPolicy, StepContext, make_policy
from specserve.speculation.policies.parts.probe import NeighbourExplorer
from specserve.speculation.policies.parts.ties import argmax_smallest as best_k

# Ground truth: 6 ms fixed, 0.05 us per context token, 60 us per batched token, 1 ms and 20 us per
# request for each draft pass. At alpha = 0.7 its optimum falls from k = 3 at B = 1 to k = 1 at B = 256.
TRUE = (6e-3, 0.05e-6, 60e-6, 1e-3, 20e-6)
CONTEXT_PER_REQUEST = 1000


def analytic_goodputs(coefficients, alpha: float, num_running: int, max_k: int) -> list[float]:
    """Eq. 4 over the true latency, written out independently of the policy's code."""
    goodputs = []
    for k in range(max_k + 1):
        tokens = k + 1 if alpha == 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)
        step_s = true_step_s(
            coefficients, CONTEXT_PER_REQUEST * num_running, num_running * (k + 1), max(k, 1), num_running
        )
        goodputs.append(num_running * tokens / step_s)
    return goodputs


def trained_policy(coefficients, alpha: float, max_k: int = 6) -> GoodputPolicy:
    policy = make_policy(f"goodput:max_k={max_k},ema_half_life_steps=500", EngineTraits(max_k=8))
    for record in varied_records(seed=11, coefficients=coefficients, alpha=alpha, max_k=max_k, num_steps=3000):
        policy.observe(record)
    return policy


def context(num_running: int, now_s: float = 0.0) -> StepContext:
    return StepContext(
        now_s=now_s, num_running=num_running, num_waiting=0, num_context_tokens=CONTEXT_PER_REQUEST * num_running
    )


@pytest.mark.parametrize("num_running", [1, 4, 16, 64, 256])
def test_picks_the_analytic_optimum(num_running: int) -> None:
    policy = trained_policy(TRUE, alpha=0.7)
    goodputs = analytic_goodputs(TRUE, 0.7, num_running, max_k=6)
    expected = max(range(len(goodputs)), key=lambda k: (goodputs[k], -k))
    runner_up = max(g for k, g in enumerate(goodputs) if k != expected)
    assert goodputs[expected] > runner_up * 1.005, "scenario too close to a tie to test the learned fit"
    assert policy.choose(context(num_running)).k == expected


def test_small_batches_speculate_more_than_large_ones() -> None:
    policy = trained_policy(TRUE, alpha=0.7)
    assert [policy.choose(context(b)).k for b in (1, 16, 256)] == [3, 2, 1]


def test_no_acceptance_means_no_speculation() -> None:
    policy = trained_policy(TRUE, alpha=0.0)
    assert [policy.choose(context(b)).k for b in (1, 16, 256)] == [0, 0, 0]


def test_full_acceptance_with_overhead_dominated_steps_uses_max_k() -> None:
    overhead = (20e-3, 0.01e-6, 1e-6, 0.1e-3, 1e-6)
    policy = trained_policy(overhead, alpha=1.0, max_k=5)
    assert [policy.choose(context(b)).k for b in (1, 16)] == [5, 5]


def test_ties_go_to_the_smaller_k() -> None:
    assert best_k([1.0, 1.0, 0.5]) == 0
    assert best_k([1.0, 1.0 + 1e-12, 1.0]) == 0  # within the relative tolerance
    assert best_k([1.0, 2.0, 2.0, 1.5]) == 1
    assert best_k([1.0, 1.1]) == 1


def test_search_is_capped_by_the_engine() -> None:
    policy = make_policy("goodput:max_k=8,prior_alpha=1.0", EngineTraits(max_k=2))
    assert policy.choose(context(1)).k == 2


def test_zero_when_draft_absent_or_idle() -> None:
    policy = make_policy("goodput:prior_alpha=1.0", EngineTraits(max_k=4))
    absent = StepContext(now_s=0.0, num_running=4, num_waiting=0, num_context_tokens=4000, draft_resident=False)
    assert policy.choose(absent).k == 0
    assert policy.choose(context(0)).k == 0


def test_settles_on_zero_and_still_probes() -> None:
    """Closed loop at alpha = 0: the policy drops to k = 0, then speculates probe_k once per interval."""
    policy = make_policy("goodput:probe_interval_s=1.0,probe_k=2", EngineTraits(max_k=4))
    rng, now_s, chosen = random.Random(5), 0.0, []
    for _ in range(500):  # 5 s of 10 ms steps (float sums make a 1 s interval 100 or 101 steps)
        k = policy.choose(context(8, now_s)).k
        policy.observe(
            make_record(
                rng, TRUE, now_s=now_s, k=k, num_running=8, alpha=0.0, num_context_tokens=CONTEXT_PER_REQUEST * 8
            )
        )
        chosen.append(k)
        now_s += 0.01
    assert chosen[0] > 0  # the 0.5 prior makes small batches speculate at first
    settled = chosen[50:]
    assert set(settled) == {0, 2}
    probe_steps = [i for i, k in enumerate(settled) if k == 2]
    assert len(probe_steps) >= 3 and all(b - a in (100, 101) for a, b in pairwise(probe_steps))

    # Settled: a probe is due 1 s after the previous one, then the clock restarts from the probe.
    probe_s = now_s + 2.0
    ks = []
    for dt in (0.0, 0.01, 0.99, 1.01, 1.02):
        ks.append(policy.choose(context(8, probe_s + dt)).k)
        policy.observe(
            make_record(
                rng,
                TRUE,
                now_s=probe_s + dt,
                k=ks[-1],
                num_running=8,
                alpha=0.0,
                num_context_tokens=CONTEXT_PER_REQUEST * 8,
            )
        )
    assert ks == [2, 0, 0, 2, 0]


def test_probe_lasts_until_its_drafts_are_verified() -> None:
    """vLLM verifies step t's drafts in step t+1: the probe holds k until a verdict arrives."""
    policy = make_policy("goodput:probe_interval_s=1.0,probe_k=1,prior_alpha=0.0", EngineTraits(max_k=4))
    rng = random.Random(3)

    def step(now_s: float, verified_k: int) -> int:
        k = policy.choose(context(8, now_s)).k
        policy.observe(
            make_record(
                rng,
                TRUE,
                now_s=now_s,
                k=verified_k,
                num_running=8,
                alpha=0.0,
                num_context_tokens=CONTEXT_PER_REQUEST * 8,
            )
        )
        return k

    assert step(0.0, 0) == 0  # the clock starts
    assert step(1.5, 0) == 1  # probe: drafts proposed, nothing verified yet
    assert step(1.51, 0) == 1  # still no verdict: keep the drafts alive
    assert step(1.52, 1) == 1  # this step verifies them...
    assert step(1.53, 0) == 0  # ...so the probe is over


def test_describe_reports_estimates() -> None:
    policy = trained_policy(TRUE, alpha=0.8, max_k=3)
    policy.choose(context(4))
    described = policy.describe()
    assert {"alpha_0", "alpha_1", "alpha_2", "mean_alpha", "predicted_goodput_tokens_per_s"} <= described.keys()
    assert described["alpha_0"] == pytest.approx(0.8, abs=0.02)
    assert described["latency_s_per_batched_token"] == pytest.approx(TRUE[2], rel=0.05)
    assert described["predicted_goodput_tokens_per_s"] > 0


def test_k0_is_charged_a_draft_pass_only_where_the_engine_runs_one() -> None:
    syncing = make_policy("goodput", EngineTraits(max_k=4, k0_runs_draft_pass=True))
    free = make_policy("goodput", EngineTraits(max_k=4, k0_runs_draft_pass=False))
    # Prior latency: the pass costs 1 ms + 16 * 10 us on top of the same k = 0 target step.
    assert 1 / syncing.predict_goodput(context(16), 0) - 1 / free.predict_goodput(context(16), 0) == pytest.approx(
        (1e-3 + 16 * 10e-6) / 16
    )


def test_speculation_must_pay_a_minimum_gain_over_k0() -> None:
    """Where k = 1 costs what k = 0 costs (vLLM's k = 0 still runs a draft pass, and verifying one
    more token per request is nearly free on small models), a near-useless draft must not win on the
    estimate's noise: k > 0 has to add min_gain over k = 0."""
    free_verify = (6e-3, 0.0, 0.0, 1e-3, 0.0)
    policy = trained_policy(free_verify, alpha=0.01, max_k=4)
    assert policy.choose(context(4)).k == 0
    eager = make_policy("goodput:max_k=4,ema_half_life_steps=500,min_gain=0", EngineTraits(max_k=8))
    for record in varied_records(seed=11, coefficients=free_verify, alpha=0.01, max_k=4, num_steps=3000):
        eager.observe(record)
    assert eager.choose(context(4)).k == 1


# Compute-bound ground truth: 150 us per batched token dominates, so at B ~ 240 and alpha = 0.66 k = 0 is best
# (k = 0: 256 tokens in 47 ms; k = 1: 425 tokens in 85 ms), while small batches gain from speculating.
COMPUTE_BOUND = (5e-3, 0.0, 150e-6, 1e-3, 10e-6)


def stuck_then_closed_loop(spec: str, seconds: float, seed: int = 0) -> list[tuple[float, int]]:
    """Feed 200 steps at k = 4 while the batch grows 8 -> 207 (the policy sat at max_k as load rose, so every
    k-dependent feature grew with B and context), then run the policy closed loop at B in 224..256."""
    policy = make_policy(spec, EngineTraits(max_k=4))
    rng, now_s = random.Random(seed), 0.0
    for step in range(200):
        num_running = 8 + step
        policy.observe(
            make_record(
                rng,
                COMPUTE_BOUND,
                now_s=now_s,
                k=4,
                num_running=num_running,
                alpha=0.66,
                num_context_tokens=CONTEXT_PER_REQUEST * num_running,
            )
        )
        now_s += 0.05
    start_s, chosen = now_s, []
    while now_s - start_s < seconds:
        num_running = rng.randint(224, 256)
        k = policy.choose(context(num_running, now_s)).k
        record = make_record(
            rng,
            COMPUTE_BOUND,
            now_s=now_s,
            k=k,
            num_running=num_running,
            alpha=0.66,
            num_context_tokens=CONTEXT_PER_REQUEST * num_running,
        )
        policy.observe(record)
        chosen.append((now_s - start_s, k))
        now_s += record.duration_s
    return chosen


def test_exploration_brings_a_policy_stuck_at_max_k_down_to_zero() -> None:
    """Without exploration the fit, having seen only k = 4, keeps k = 4 for good; one neighbouring step per
    second walks it down to 0 within seconds, after which only probes (k = 1) leave 0."""
    stuck = stuck_then_closed_loop("goodput:max_k=4,explore_interval_s=inf", seconds=20.0)
    assert {k for _, k in stuck} == {4}
    for seed in range(3):
        chosen = stuck_then_closed_loop("goodput:max_k=4,explore_interval_s=1.0", seconds=20.0, seed=seed)
        first_zero_s = next(t for t, k in chosen if k == 0)
        assert first_zero_s < 5.0
        late = [k for t, k in chosen if t > 10.0]
        assert set(late) <= {0, 1} and sum(k > 0 for k in late) < 0.05 * len(late)


def test_settled_policy_explores_one_neighbour_per_interval() -> None:
    """A perfect draft on overhead-dominated steps settles at max_k = 4: one step at k = 3 per interval."""
    overhead = (20e-3, 0.01e-6, 1e-6, 0.1e-3, 1e-6)
    policy = make_policy("goodput:max_k=4,prior_alpha=1.0,explore_interval_s=0.5", EngineTraits(max_k=4))
    rng, now_s, chosen = random.Random(1), 0.0, []
    while now_s < 10.0:
        k = policy.choose(context(8, now_s)).k
        record = make_record(
            rng, overhead, now_s=now_s, k=k, num_running=8, alpha=1.0, num_context_tokens=CONTEXT_PER_REQUEST * 8
        )
        policy.observe(record)
        chosen.append(k)
        now_s += record.duration_s
    assert set(chosen) == {3, 4}
    assert chosen.count(3) == policy.describe()["num_explorations"] == 19  # 10 s / 0.5 s, the first starts the clock
    assert max(b - a for a, b in pairwise(chosen)) == 1  # single steps: back to 4 right after


def test_explorer_alternates_and_restarts_after_gaps_or_moves() -> None:
    explorer = NeighbourExplorer(interval_s=1.0)
    assert [explorer.neighbour(t, 2, max_k=4) for t in (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)] == [2, 2, 1, 2, 3, 1]
    assert explorer.neighbour(3.5, 4, max_k=4) == 4  # the policy moved: the clock restarts
    assert explorer.neighbour(4.5, 4, max_k=4) == 3  # at max_k only down, whatever the turn
    assert explorer.neighbour(6.0, 4, max_k=4) == 4  # 1.5 s since the last step (an idle engine): restart
    assert explorer.neighbour(6.5, 4, max_k=4) == 4
    explorer.stopped()  # k = 0: the probe's turn
    assert explorer.neighbour(7.0, 4, max_k=4) == 4
    assert explorer.num_explorations == 4


def test_a_step_up_on_an_engine_that_drafts_ahead_lasts_until_its_deepest_draft_is_verified() -> None:
    # vLLM verifies in each step the drafts the step before made, cut to this step's k: verified = min(k, k before).
    def deepest_verified(up_steps: int) -> int:
        explorer, made, deepest = NeighbourExplorer(interval_s=1.0, up_steps=up_steps), 2, 0
        for step in range(40):
            k = explorer.neighbour(0.25 * step, 2, max_k=4)
            deepest, made = max(deepest, min(k, made)), k
        return deepest

    assert deepest_verified(up_steps=1) == 2  # one step at 3 pays a pass and verifies the 2 drafts made before it
    assert deepest_verified(up_steps=2) == 3
    explorer = NeighbourExplorer(interval_s=1.0, up_steps=2)
    chosen = [explorer.neighbour(0.5 * step, 2, max_k=4) for step in range(10)]
    assert chosen == [2, 2, 1, 2, 3, 3, 2, 1, 2, 3]  # down one step, up two
    assert explorer.num_explorations == 4
    assert explorer.neighbour(5.0, 1, max_k=4) == 1  # the policy moved: no step up left over
    with pytest.raises(ValueError, match="up_steps=0"):
        NeighbourExplorer(interval_s=1.0, up_steps=0)


def test_prefill_chunk_is_not_charged_to_k() -> None:
    """A chunk that runs whatever k is must not make speculation look cheap: with 8192 prefill tokens in
    the step, charging them to the decodes would amortise them like a fixed cost and favour k = 4."""
    policy = trained_policy(COMPUTE_BOUND, alpha=0.66, max_k=4)
    decode_only = context(240)
    with_chunk = StepContext(
        now_s=0.0,
        num_running=240,
        num_waiting=50,
        num_prefill_tokens=8192,
        num_context_tokens=CONTEXT_PER_REQUEST * 240,
    )
    assert policy.choose(decode_only).k == policy.choose(with_chunk).k == 0
