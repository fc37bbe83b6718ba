"""UcbPolicy: context-free UCB1 over k, the BanditSpec baseline that Nightjar compares against (§8).

Worked example of the score (UCB1, exploration 2): means 100 and 200 tokens/s after 1 and 20 plays,
r_max = 200: arm 0 scores 0.5 + sqrt(2 ln 21 / 1) = 2.968, arm 1 scores 1 + sqrt(2 ln 21 / 20) = 1.552,
so the rarely played arm is tried again although its mean is half.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from speculation_synthetic import make_record

from specserve.speculation import EngineTraits, StepContext, StepRecord, UcbPolicy, make_policy
from specserve.speculation.policies.ucb import step_reward, ucb_pick

TRUE = (6e-3, 0.05e-6, 60e-6, 1e-3, 20e-6)
# 20 ms fixed cost per step and almost nothing per token or draft pass: longer drafts are nearly free.
OVERHEAD = (20e-3, 0.01e-6, 1e-6, 0.1e-3, 1e-6)
BATCH = 8


def context(num_running: int = BATCH, draft_resident: bool = True) -> StepContext:
    return StepContext(
        now_s=0.0,
        num_running=num_running,
        num_waiting=0,
        num_context_tokens=1000 * num_running,
        draft_resident=draft_resident,
    )


def closed_loop(policy: UcbPolicy, coefficients, alpha: float, num_steps: int, seed: int = 1) -> list[int]:
    rng, ks = random.Random(seed), []
    for step in range(num_steps):
        k = policy.choose(context()).k
        policy.observe(
            make_record(
                rng,
                coefficients,
                now_s=step * 0.01,
                k=k,
                num_running=BATCH,
                alpha=alpha,
                num_context_tokens=1000 * BATCH,
            )
        )
        ks.append(k)
    return ks


def test_score_worked_example() -> None:
    # The module docstring's example; with 20 plays each, the better arm goes next.
    assert ucb_pick([100.0, 200.0], [1, 20], exploration=2.0, max_reward=200.0) == 0
    assert ucb_pick([100.0, 200.0], [20, 20], exploration=2.0, max_reward=200.0) == 1
    assert ucb_pick([100.0, 200.0], [1, 20], exploration=0.0, max_reward=200.0) == 1  # greedy


def test_ties_go_to_the_smaller_k() -> None:
    assert ucb_pick([5.0, 5.0, 5.0], [4, 4, 4], exploration=2.0, max_reward=5.0) == 0
    assert ucb_pick([1.0, 2.0, 2.0], [3, 3, 3], exploration=2.0, max_reward=2.0) == 1
    assert ucb_pick([1.0, 1.0, 1.0], [3, 0, 0], exploration=2.0, max_reward=1.0) == 1  # unplayed, smallest first


def test_reward_is_tokens_per_second_per_request() -> None:
    record = StepRecord(
        now_s=0.0,
        k=2,
        duration_s=0.012,
        num_running=8,
        num_context_tokens=8000,
        num_batched_tokens=24,
        num_draft_passes=2,
        num_emitted_tokens=24,
    )
    assert step_reward(record) == pytest.approx(24 / 8 / 0.012)  # 250 tokens/s per request


def test_explores_every_arm_once_then_exploits_the_best() -> None:
    policy = make_policy("ucb:max_k=4", EngineTraits(max_k=4))
    ks = closed_loop(policy, OVERHEAD, alpha=1.0, num_steps=2000)
    assert ks[:5] == [0, 1, 2, 3, 4]
    late = Counter(ks[1000:])
    assert late.most_common(1)[0][0] == 4 and late[4] > 0.9 * 1000


def test_no_acceptance_settles_on_zero() -> None:
    policy = make_policy("ucb:max_k=4", EngineTraits(max_k=4))
    ks = closed_loop(policy, TRUE, alpha=0.0, num_steps=3000)
    assert ks[:5] == [0, 1, 2, 3, 4]
    assert Counter(ks[1500:]).most_common(1)[0][0] == 0


def test_identical_arms_tie_to_the_smaller_k() -> None:
    """Steps of equal length and yield whatever k: every arm's reward is equal, k = 0 wins the ties."""
    policy = make_policy("ucb:max_k=3,exploration=0", EngineTraits(max_k=4))
    for _ in range(3):
        for k in range(4):
            policy.observe(
                StepRecord(
                    now_s=0.0,
                    k=k,
                    duration_s=0.01,
                    num_running=4,
                    num_context_tokens=400,
                    num_batched_tokens=4,
                    num_draft_passes=1,
                    num_emitted_tokens=4,
                )
            )
    assert policy.choose(context(4)).k == 0


def test_arms_capped_by_engine_and_zero_without_draft() -> None:
    policy = make_policy("ucb:max_k=6", EngineTraits(max_k=2))
    assert policy.max_k == 2
    assert policy.choose(context(draft_resident=False)).k == 0
    assert policy.choose(context(num_running=0)).k == 0


@pytest.mark.parametrize("spec", ["ucb", "ucb:max_k=3,exploration=0.5"])
def test_spec_round_trips(spec: str) -> None:
    policy = make_policy(spec, EngineTraits(max_k=4))
    rebuilt = make_policy(policy.spec, EngineTraits(max_k=4))
    assert type(rebuilt) is type(policy) and rebuilt.params == policy.params and rebuilt.spec == policy.spec


@pytest.mark.parametrize(("spec", "named"), [("ucb:max_k=-1", "max_k"), ("ucb:exploration=-2", "exploration")])
def test_bad_params(spec: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        make_policy(spec, EngineTraits(max_k=4))
