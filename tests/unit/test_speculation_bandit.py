"""BanditPolicy: Nightjar's per-batch-size ADA-BINGREEDY with a switching cost (Nightjar §5).

Worked examples: log2 buckets 3-4 -> 2, 5-8 -> 3, 9-16 -> 4, capped at 11 (the authors' released planner);
Table 3's C_sw (17.87 ms at L=128, B=32 ... 102.03 ms at L=512, B=64, §5.2); bin lengths 1, 1, 2, 2, 4, 5, 8,
11, 16, 22, 32 per block with the first bin of every block exploring (§5.2, Algorithm 1).
Eq. (4) by hand, lbar = 10, 8, 7, 7.5 ms for k = 0..3 and C_sw = 12 ms with speculation off:
10, 8 + 12, 7 + 6, 7.5 + 4 -> k = 0 stays; with speculation on k = 2 wins.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from speculation_synthetic import make_record

from specserve.speculation import BanditPolicy, EngineTraits, StepContext, StepRecord, SwitchCostTable, make_policy
from specserve.speculation.policies.bandit import bucket_of, exploit_k
from specserve.speculation.policies.parts.bingreedy import bin_rounds, block_rounds, explore_probability, num_bins
from specserve.speculation.policies.parts.switching import DEFAULT_SWITCH_COST_TABLE

TRUE = (6e-3, 0.05e-6, 60e-6, 1e-3, 20e-6)
OVERHEAD = (20e-3, 0.01e-6, 1e-6, 0.1e-3, 1e-6)
INF = float("inf")


def context(num_running: int, draft_resident: bool = True, context_per_request: int = 1000) -> StepContext:
    return StepContext(
        now_s=0.0,
        num_running=num_running,
        num_waiting=0,
        num_context_tokens=context_per_request * num_running,
        draft_resident=draft_resident,
    )


def closed_loop(
    policy: BanditPolicy,
    coefficients,
    alpha: float,
    num_steps: int,
    num_running: int = 8,
    k0_runs_draft_pass: bool = True,
) -> list[int]:
    rng, ks = random.Random(1), []
    for step in range(num_steps):
        k = policy.choose(context(num_running)).k
        policy.observe(
            make_record(
                rng,
                coefficients,
                now_s=step * 0.01,
                k=k,
                num_running=num_running,
                alpha=alpha,
                num_context_tokens=1000 * num_running,
                k0_runs_draft_pass=k0_runs_draft_pass,
            )
        )
        ks.append(k)
    return ks


def record(
    k: int,
    latency_per_token_s: float,
    num_running: int = 32,
    draft_pass: bool = False,
    prefill_tokens: int = 0,
    emitted_per_request: int = 1,
) -> StepRecord:
    """A step whose tau * B / m is the given latency per token."""
    emitted = emitted_per_request * num_running
    return StepRecord(
        now_s=0.0,
        k=k,
        duration_s=latency_per_token_s * emitted / num_running,
        num_running=num_running,
        num_context_tokens=100 * num_running,
        num_batched_tokens=num_running * (k + 1) + prefill_tokens,
        num_draft_passes=k if k else int(draft_pass),
        num_emitted_tokens=emitted,
    )


# --- bucketing -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batch", "bucket"),
    [
        (1, 0),
        (2, 1),
        (3, 2),
        (4, 2),
        (5, 3),
        (8, 3),
        (9, 4),
        (16, 4),
        (17, 5),
        (512, 9),
        (513, 10),
        (1024, 10),
        (1025, 11),
        (5000, 11),
    ],
)
def test_log2_buckets(batch: int, bucket: int) -> None:
    assert bucket_of(batch) == bucket


def test_bucket_cap_and_exact_mode() -> None:
    assert bucket_of(64, max_bucket=5) == 5 and bucket_of(16, max_bucket=5) == 4
    assert [bucket_of(b, "exact") for b in (1, 3, 4, 5, 5000)] == [1, 3, 4, 5, 5000]


def test_contexts_advance_only_on_their_own_steps() -> None:
    """Fig. 6: only steps with batch context b count on b's local timeline."""
    policy = make_policy("bandit", EngineTraits(max_k=4))
    for batch in (3, 8, 4, 3, 16, 4, 7):
        policy.choose(context(batch))
    # Bucket 2 (B = 3, 4) saw 4 rounds: blocks of 1 and 2 rounds, then the first round of block 3.
    assert (policy.schedule(2).block, policy.schedule(2).bin, policy.schedule(2).round) == (3, 1, 1)
    assert (policy.schedule(3).block, policy.schedule(3).bin) == (2, 2)  # B = 8, 7: two rounds
    assert (policy.schedule(4).block, policy.schedule(4).bin) == (2, 1)  # B = 16: one round


# --- switching cost (Table 3) --------------------------------------------------------------------------------

TABLE = SwitchCostTable.parse(DEFAULT_SWITCH_COST_TABLE)


@pytest.mark.parametrize(
    ("length", "batch", "ms"),
    [
        (128, 32, 17.87),
        (128, 64, 28.53),
        (256, 32, 20.65),
        (256, 64, 22.33),
        (512, 32, 24.30),
        (512, 64, 102.03),
        (192, 32, (17.87 + 20.65) / 2),  # linear in L
        (128, 2**5.5, (17.87 + 28.53) / 2),  # linear in log2 B: 45.25 is halfway from 32 to 64
        (384, 2**5.5, ((20.65 + 22.33) / 2 + (24.30 + 102.03) / 2) / 2),  # bilinear: 42.3275
        (64, 32, 17.87 / 2),  # toward 0 at L = 0
        (1024, 32, 24.30 * 2),
        (1024, 64, 102.03 * 2),  # proportional past the grid
        (128, 8, 17.87),
        (256, 128, 22.33),  # clamped in B
        (0, 32, 0.0),
    ],
)
def test_switch_cost_interpolates_table_3(length: float, batch: float, ms: float) -> None:
    assert TABLE.cost_s(length, batch) * 1000 == pytest.approx(ms)


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ("128x32:17.87/128x64:28.53/256x32:20.65", "256x64"),  # missing grid point
        ("128x32:17.87/128-64:28.53", "'128-64:28.53'"),
        ("128x32:fast", "'128x32:fast'"),
        ("0x32:1", "'0x32:1'"),
        ("128x32:1/128x32:2", "repeats"),
    ],
)
def test_bad_switch_cost_tables_name_the_bad_part(table: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        make_policy(f"bandit:switch_cost_table={table}", EngineTraits(max_k=4))


def test_lag_grows_only_while_the_draft_is_skipped() -> None:
    policy = make_policy("bandit", EngineTraits(max_k=4, k0_runs_draft_pass=False))
    for _ in range(192):
        policy.observe(record(0, 0.01))  # 192 decode steps without the draft: every request lags 192 tokens
    assert policy.switch_cost_s(context(32)) * 1000 == pytest.approx((17.87 + 20.65) / 2)
    policy.observe(record(0, 0.01, prefill_tokens=300))  # a request admitted meanwhile lags by its prompt
    assert policy.describe()["draft_lag_tokens"] == 300
    policy.observe(record(0, 0.01, draft_pass=True))  # vLLM's k = 0 keeps the draft in sync
    assert policy.switch_cost_s(context(32)) == 0.0
    policy.observe(record(0, 0.01))
    policy.observe(record(2, 0.01))  # speculating again: caught up
    assert policy.switch_cost_s(context(32)) == 0.0


def test_an_engine_that_measured_its_catch_up_is_priced_by_it_not_table_3() -> None:
    traits = EngineTraits(max_k=4, k0_runs_draft_pass=False, resume_s_per_token=2e-5)
    policy = make_policy("bandit", traits)
    for _ in range(192):
        policy.observe(record(0, 0.01))
    # The engine catches up all but the one token its last pass wrote ahead, for every request.
    assert policy.switch_cost_s(context(32)) == pytest.approx(2e-5 * 191 * 32)
    policy.observe(record(2, 0.01))
    assert policy.switch_cost_s(context(32)) == 0.0


def test_offloaded_draft_must_rebuild_the_whole_context() -> None:
    policy = make_policy("bandit", EngineTraits(max_k=4))
    assert policy.choose(context(64, draft_resident=False)).k == 0
    assert policy.switch_cost_s(context(64, context_per_request=512)) * 1000 == pytest.approx(102.03)
    policy.observe(record(1, 0.01, num_running=64))
    assert policy.switch_cost_s(context(64, context_per_request=512)) == 0.0


# --- Eq. (4) -------------------------------------------------------------------------------------------


def test_exploit_rule_worked_example() -> None:
    latencies = [10e-3, 8e-3, 7e-3, 7.5e-3]
    assert exploit_k(latencies, 12e-3, speculation_off=True) == 0
    assert exploit_k(latencies, 12e-3, speculation_off=False) == 2
    # C_sw = 3 ms: 10, 11, 8.5, 8.5 -> a tie between k = 2 and 3 goes to the smaller.
    assert exploit_k(latencies, 3e-3, speculation_off=True) == 2
    assert exploit_k([INF, 5e-3, INF], 0.0, speculation_off=False) == 1  # unvisited arms never win
    assert exploit_k([INF, INF], 0.0, speculation_off=False) == 0


def test_switching_cost_holds_speculation_off() -> None:
    """lbar: 10 ms at k = 0, 9 ms at k = 1 (B = 32). After 600 skipped steps, C_sw = 28.5 ms > the 1 ms gain."""
    policy = make_policy("bandit:max_k=1", EngineTraits(max_k=4, k0_runs_draft_pass=False))
    plain = make_policy("bandit:max_k=1,switch_cost_scale=0", EngineTraits(max_k=4, k0_runs_draft_pass=False))
    for p in (policy, plain):
        p.observe(record(1, 9e-3, emitted_per_request=2))
        for _ in range(600):
            p.observe(record(0, 10e-3))
    assert policy.mean_latencies_s(5) == pytest.approx([10e-3, 9e-3])
    assert policy.switch_cost_s(context(32)) * 1000 == pytest.approx(24.30 * 600 / 512)
    assert policy.exploit(context(32)) == 0
    assert plain.exploit(context(32)) == 1  # plain ADA-BINGREEDY ignores the re-prefill
    policy.observe(record(1, 9e-3, emitted_per_request=2))  # once on, changing k is free
    assert policy.exploit(context(32)) == 1
    assert policy.describe()["num_reenables"] == 1


# --- schedule ------------------------------------------------------------------------------------------


def test_block_and_bin_lengths() -> None:
    assert [block_rounds(j) for j in range(1, 8)] == [1, 2, 4, 8, 16, 32, 64]
    assert [bin_rounds(j) for j in range(1, 12)] == [1, 1, 2, 2, 4, 5, 8, 11, 16, 22, 32]
    assert [num_bins(j) for j in range(1, 12)] == [1, 2, 2, 4, 4, 7, 8, 12, 16, 24, 32]
    assert explore_probability(4, "inv_sqrt") == 0.5 and explore_probability(4, "inv") == 0.25


def bin_log(seed: int, num_rounds: int, schedule: str = "inv_sqrt") -> list[tuple[int, int, int, bool]]:
    """(block, bin, rounds, explored) for every bin one context runs through."""
    policy = make_policy(f"bandit:seed={seed},explore_schedule={schedule}", EngineTraits(max_k=4))
    state, bins = policy.schedule(3), []
    for _ in range(num_rounds):
        if state.at_bin_start:
            bins.append([state.block, state.bin, 0, False])
        policy.choose(context(8))
        bins[-1][2] += 1
        bins[-1][3] = state.explore
    return [tuple(b) for b in bins]


# Rounds in blocks 1..11: H_j each, plus the last bin's overshoot where l_j does not divide H_j (35 for 32).
ROUNDS_TO_BLOCK_12 = sum(bin_rounds(j) * num_bins(j) for j in range(1, 12))


def test_schedule_on_one_context() -> None:
    assert ROUNDS_TO_BLOCK_12 == 2**11 - 1 + 3 + 4 + 16  # blocks 6, 8 and 10 overshoot (35, 132, 528)
    bins = bin_log(seed=0, num_rounds=ROUNDS_TO_BLOCK_12)
    for block in range(1, 12):
        lengths = [rounds for j, _, rounds, _ in bins if j == block]
        assert lengths == [bin_rounds(block)] * num_bins(block)
        assert [explored for j, i, _, explored in bins if j == block and i == 1] == [True]


@pytest.mark.parametrize(("schedule", "bin_index"), [("inv_sqrt", 4), ("inv_sqrt", 16), ("inv", 4)])
def test_exploration_decays_with_the_bin_index(schedule: str, bin_index: int) -> None:
    draws = [
        explored
        for seed in range(60)
        for _, i, _, explored in bin_log(seed, ROUNDS_TO_BLOCK_12, schedule)
        if i == bin_index
    ]
    assert sum(draws) / len(draws) == pytest.approx(explore_probability(bin_index, schedule), abs=0.08)


# --- closed loop ----------------------------------------------------------------------------------------


def test_no_acceptance_converges_to_zero() -> None:
    policy = make_policy("bandit", EngineTraits(max_k=4))
    ks = closed_loop(policy, TRUE, alpha=0.0, num_steps=3000)
    late = Counter(ks[1500:])
    assert late.most_common(1)[0][0] == 0 and late[0] > 0.6 * 1500
    assert policy.exploit(context(8)) == 0


def test_full_acceptance_with_overhead_dominated_steps_uses_max_k() -> None:
    policy = make_policy("bandit", EngineTraits(max_k=4))
    ks = closed_loop(policy, OVERHEAD, alpha=1.0, num_steps=3000)
    late = Counter(ks[1500:])
    assert late.most_common(1)[0][0] == 4 and late[4] > 0.6 * 1500
    assert policy.exploit(context(8)) == 4
    lbar = policy.mean_latencies_s(3)
    assert lbar == sorted(lbar, reverse=True)  # each extra accepted draft cuts latency per token


def test_same_seed_same_sequence() -> None:
    def run(seed: int) -> list[int]:
        policy = make_policy(f"bandit:seed={seed}", EngineTraits(max_k=4, k0_runs_draft_pass=False))
        return closed_loop(policy, TRUE, alpha=0.6, num_steps=800, k0_runs_draft_pass=False)

    assert run(0) == run(0)
    assert run(0) != run(1)


def test_zero_without_draft_or_batch() -> None:
    policy = make_policy("bandit:max_k=4", EngineTraits(max_k=2))
    assert policy.max_k == 2
    assert all(policy.choose(context(8, draft_resident=False)).k == 0 for _ in range(20))
    assert policy.choose(context(0)).k == 0


@pytest.mark.parametrize(
    "spec",
    [
        "bandit",
        "bandit:seed=3,explore_schedule=inv,bucketing=exact",
        "bandit:max_k=3,max_bucket=6,switch_cost_scale=0.5,switch_cost_table=128x32:10.0/256x32:20.0",
    ],
)
def test_spec_round_trips(spec: str) -> None:
    policy = make_policy(spec, EngineTraits(max_k=4))
    rebuilt = make_policy(policy.spec, EngineTraits(max_k=4))
    assert type(rebuilt) is type(policy) and rebuilt.params == policy.params and rebuilt.spec == policy.spec


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("bandit:explore_schedule=log", "explore_schedule"),
        ("bandit:bucketing=pow2", "bucketing"),
        ("bandit:max_bucket=-1", "max_bucket"),
        ("bandit:switch_cost_scale=-1", "switch_cost_scale"),
        ("bandit:max_k=-1", "max_k"),
        ("bandit:seed=x", "seed"),
    ],
)
def test_bad_params(spec: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        make_policy(spec, EngineTraits(max_k=4))
