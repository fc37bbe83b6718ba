"""KldPolicy: DSDE — a worked example of Eqs. 1-11, per-sequence lengths, the batch cap, fallback."""

from __future__ import annotations

import pytest

from specserve.speculation import EngineTraits, KldPolicy, StepContext, StepRecord, make_policy
from specserve.speculation.policies.parts.kld_signals import (
    batch_cap,
    calibrated_max_length,
    predicted_length,
    round_half_up,
    scale_factor,
    weighted_variance,
    wvir,
)

# A worked example (our arithmetic on DSDE Eqs. 1-11): per-step mean KLD, most recent first.
HISTORY = [0.30, 0.25, 0.40, 0.35, 0.20, 0.30, 0.28, 0.33, 0.27, 0.31] + [
    0.10,
    0.12,
    0.09,
    0.11,
    0.10,
    0.13,
    0.08,
    0.12,
    0.10,
    0.11,
] * 2


def test_calibration_worked_example() -> None:
    assert calibrated_max_length(6, 0.4, 2.0) == pytest.approx(7.1999994, abs=1e-7)
    assert calibrated_max_length(6, 0.0, 0.0) == 6.0  # bounds: SL_A,max <= SL_max <= 2 SL_A,max
    assert calibrated_max_length(6, 2.0, 2.0) == pytest.approx(12.0, abs=1e-5)


def test_wvir_worked_example() -> None:
    assert weighted_variance(HISTORY[:10], 0.85) == pytest.approx(0.003140, abs=1e-6)
    assert weighted_variance(HISTORY, 0.85) == pytest.approx(0.008454, abs=1e-6)
    assert wvir(HISTORY, 0.85, 10, 30) == pytest.approx(0.3713, abs=1e-4)
    # Our defaults where DSDE is silent: too short a history, or a constant one, is neither growing nor settling.
    assert wvir([0.3], 0.85, 10, 30) == 1.0 and wvir([0.2] * 12, 0.85, 10, 30) == 1.0


@pytest.mark.parametrize(
    ("mu", "sf", "penalty", "length"),
    [
        (0.0, 0.0, 0.0, 7.20),
        (0.1, 0.2214, 0.0822, 6.77),
        (0.2, 0.4918, 0.1826, 6.25),
        (0.3, 0.8221, 0.3053, 5.61),
        (0.5, 1.7183, 0.6381, 3.88),
    ],
)
def test_prediction_table(mu: float, sf: float, penalty: float, length: float) -> None:
    ratio = wvir(HISTORY, 0.85, 10, 30)
    assert scale_factor(mu) == pytest.approx(sf, abs=1e-4)
    assert scale_factor(mu) * ratio == pytest.approx(penalty, abs=1e-4)
    assert predicted_length(scale_factor(mu), ratio, 7.2, 2) == pytest.approx(length, abs=5e-3)


def test_extreme_instability_gives_sl_min_and_cap_is_the_mean() -> None:
    assert predicted_length(2.0, 0.6, 7.2, 2) == 2.0  # P = 1.2 > 1
    assert batch_cap([7.2, 5.47, 2.0, 3.1]) == pytest.approx(4.4425)
    assert [round_half_up(x) for x in (2.5, 3.49, 4.4425)] == [3, 3, 4]


def record(klds: dict[str, tuple[float, ...]], accepted: dict[str, int]) -> StepRecord:
    ids = tuple(klds)
    drafted = tuple(len(klds[r]) for r in ids)
    return StepRecord(
        now_s=0.0,
        k=max(drafted),
        duration_s=0.01,
        num_running=len(ids),
        num_context_tokens=1000,
        num_batched_tokens=sum(drafted) + len(ids),
        num_draft_passes=max(drafted),
        num_emitted_tokens=sum(accepted.values()) + len(ids),
        num_drafted_per_request=drafted,
        num_accepted_per_request=tuple(accepted[r] for r in ids),
        request_ids=ids,
        kl_per_request=tuple(klds[r] for r in ids),
    )


def context(ids: tuple[str, ...]) -> StepContext:
    return StepContext(
        now_s=0.0, num_running=len(ids), num_waiting=0, num_context_tokens=1000 * len(ids), request_ids=ids
    )


def calibrated(spec: str = "kld", steps: int = 12, max_k: int = 8) -> KldPolicy:
    """Two sequences: "calm" (KLD ~0.02, all 8 accepted) and "rough" (KLD swinging 0.1-0.9, 2 accepted)."""
    policy = make_policy(spec, EngineTraits(max_k=max_k))
    for step in range(steps):
        rough = 0.9 if step % 2 else 0.1
        policy.observe(record({"calm": (0.02,) * 8, "rough": (rough,) * 8}, {"calm": 8, "rough": 2}))
    return policy


def test_calibration_then_lower_length_for_high_kl_sequences() -> None:
    policy = calibrated("kld:cap=false")
    calm, rough = policy.sequence("calm"), policy.sequence("rough")
    assert calm.max_length == pytest.approx(16.0, abs=1e-3)  # 8 * (1 + 0.02 / 0.02)
    assert rough.max_length == pytest.approx(2 * (1 + 0.42 / 0.9), abs=1e-4)  # mean of 0.1,0.9,... over 5 steps
    assert calm.predicted > rough.predicted
    decision = policy.choose(context(("calm", "rough")))
    assert decision.k == 8 and dict(decision.max_k_per_request) == {"rough": 2}  # engine max_k bounds calm


def test_batch_cap_bounds_stragglers() -> None:
    # An engine with room for 16: the calm sequence alone would draft 15 while the batch waits for it.
    ids = ("calm", "rough", "new")
    uncapped = calibrated("kld:cap=false", max_k=16).choose(context(ids))
    capped_policy = calibrated("kld", max_k=16)
    capped = capped_policy.choose(context(ids))
    predictions = [capped_policy.sequence("calm").predicted, capped_policy.sequence("rough").predicted, 8.0]
    assert uncapped.k == 15 and dict(uncapped.max_k_per_request) == {"rough": 2, "new": 8}
    assert capped.k == round_half_up(sum(predictions) / 3) == 8
    assert dict(capped.max_k_per_request) == {"rough": 2}


def test_batch_of_one_is_not_capped() -> None:
    policy = calibrated("kld:cap=true")
    assert (
        policy.choose(context(("calm",))).k
        == policy.choose(
            StepContext(now_s=0.0, num_running=1, num_waiting=0, num_context_tokens=1000, request_ids=("calm",))
        ).k
        == 8
    )


def test_new_and_finished_sequences() -> None:
    policy = calibrated()
    assert policy.choose(context(("fresh",))).k == 8  # calibrating at calib_k, capped by max_k
    assert policy.sequence("calm") is None  # forgotten once no longer running


def test_without_kl_it_is_goodput() -> None:
    policy = make_policy("kld", EngineTraits(max_k=4))
    ctx = context(("a", "b"))
    assert not policy.kl_seen
    assert policy.choose(ctx) == policy.fallback.choose(ctx)
    plain = StepRecord(
        now_s=0.0,
        k=1,
        duration_s=0.01,
        num_running=2,
        num_context_tokens=2000,
        num_batched_tokens=4,
        num_draft_passes=1,
        num_emitted_tokens=3,
        num_drafted_per_request=(1, 1),
        num_accepted_per_request=(1, 0),
    )
    policy.observe(plain)
    assert not policy.kl_seen


@pytest.mark.parametrize("spec", ["kld", "kld:sl_min=1,decay=0.9,short_window=5,long_window=20,cap=false"])
def test_spec_round_trips(spec: str) -> None:
    policy = make_policy(spec, EngineTraits(max_k=8))
    rebuilt = make_policy(policy.spec, EngineTraits(max_k=8))
    assert type(rebuilt) is KldPolicy and rebuilt.params == policy.params and rebuilt.spec == policy.spec


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("kld:sl_min=0", "sl_min"),
        ("kld:decay=0", "decay"),
        ("kld:short_window=1", "short_window"),
        ("kld:long_window=5", "long_window"),
        ("kld:calib_steps=0", "calib_steps"),
        ("kld:calib_k=1", "calib_k"),
    ],
)
def test_bad_params(spec: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        make_policy(spec, EngineTraits(max_k=8))
