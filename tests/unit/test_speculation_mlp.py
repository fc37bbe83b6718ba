"""MlpPolicy: SpecKV — the 6-16-1 predictor and the two objectives (its training: tests/lab/test_speckv_training.py).

Worked example of Eq. 1 (tokens objective): a-hat = 0.813 / 0.712 / 0.633 / 0.566 at gamma = 2 / 4 / 6 / 8 (FP16
mean acceptance by gamma in the authors' released step records) gives 2.63 / 3.85 / 4.80 / 5.53 tokens per step, so
gamma = 8 wins — the paper's +56%-over-gamma-4 result in one line.
"""

from __future__ import annotations

import json
import math
from itertools import pairwise

import pytest

from specserve.speculation import EngineTraits, MlpPolicy, StepContext, StepRecord, make_policy
from specserve.speculation.estimators.step_latency import StepLatencyModel
from specserve.speculation.policies.parts.ties import argmax_smallest
from specserve.speculation.speckv.model import (
    FEATURE_NAMES,
    load_weights,
    predict_acceptance,
    step_features,
)


def token_entropy_bits(confidence: float, num_alternatives: float) -> float:
    """Entropy in bits of top-1 mass ``confidence`` with the rest spread evenly, as the synthetic samples make it
    (lab/speckv/synthetic.py; the product does not ship the generator)."""
    rest = 1.0 - confidence
    return -confidence * math.log2(confidence) - (rest * math.log2(rest / num_alternatives) if rest > 0 else 0.0)


def test_tokens_objective_worked_example() -> None:
    rates = {2: 0.813, 4: 0.712, 6: 0.633, 8: 0.566}
    tokens = [rates[g] * g + 1 for g in (2, 4, 6, 8)]
    assert tokens == pytest.approx([2.626, 3.848, 4.798, 5.528])
    assert argmax_smallest(tokens) == 3


def test_step_features_convert_nats_to_bits() -> None:
    mean_h, mean_c, max_h, min_c = step_features((0.9, 0.5), (math.log(2), 2 * math.log(2)))
    assert (mean_h, mean_c, max_h, min_c) == pytest.approx((1.5, 0.7, 2.0, 0.5))


def test_default_weights_are_synthetic_and_monotone_in_confidence() -> None:
    weights = load_weights()
    assert len(weights.hidden_weights) == 16 and len(weights.hidden_weights[0]) == 6
    assert weights.provenance.startswith("synthetic")
    for gamma in (2, 4, 6, 8):
        for compression in (0, 1, 2):
            curve = []
            for step in range(20, 96, 5):
                c = step / 100
                h = token_entropy_bits(c, 16)
                curve.append(predict_acceptance(weights, (h, c, h, c, compression, gamma)))
            # A ReLU MLP is not monotone by construction: the shipped weights dip by at most 0.018 (gamma 6,
            # nf4, around c = 0.3) over this grid, so dips up to 0.02 per 0.05 of confidence are allowed.
            assert all(b >= a - 0.02 for a, b in pairwise(curve))
            assert curve[-1] > curve[0] + 0.5


def signal_record(confidence: float, num_running: int = 4, k: int = 4) -> StepRecord:
    entropy_nats = token_entropy_bits(confidence, 16) * math.log(2)
    return StepRecord(
        now_s=0.0,
        k=k,
        duration_s=0.01,
        num_running=num_running,
        num_context_tokens=1000,
        num_batched_tokens=num_running * (k + 1),
        num_draft_passes=k,
        num_emitted_tokens=num_running,
        num_drafted_per_request=(k,) * num_running,
        num_accepted_per_request=(0,) * num_running,
        draft_confidence_per_request=((confidence,) * k,) * num_running,
        draft_entropy_per_request=((entropy_nats,) * k,) * num_running,
    )


def context(num_running: int = 4) -> StepContext:
    return StepContext(now_s=0.0, num_running=num_running, num_waiting=0, num_context_tokens=1000 * num_running)


def test_cost_objective_picks_smaller_k_when_verification_is_expensive() -> None:
    # 2 ms per verified token and 5 ms per draft pass: every extra draft is dear.
    expensive = StepLatencyModel(prior=(5e-3, 0.0, 2e-3, 5e-3, 0.0), prior_weight=1e12)
    cost = MlpPolicy(make_policy("mlp", EngineTraits(max_k=8)).params, EngineTraits(max_k=8), latency=expensive)
    tokens = make_policy("mlp:objective=tokens", EngineTraits(max_k=8))
    for policy in (cost, tokens):
        policy.observe(signal_record(0.9))
    k_cost, k_tokens = cost.choose(context(16)).k, tokens.choose(context(16)).k
    assert k_tokens == 8 and k_cost < k_tokens


def test_prefill_chunk_is_not_charged_to_gamma() -> None:
    """The cost objective's T(gamma) is the decode part only (goodput's module docstring): charging an 8192-token
    chunk (164 ms at 20 us per token) to every candidate would move the choice at B = 64 from gamma = 4 to 8."""
    latency = StepLatencyModel(prior=(5e-3, 1e-6, 20e-6, 1e-3, 10e-6), prior_weight=1e12)
    policy = MlpPolicy(
        make_policy("mlp:gammas=0-2-4-6-8", EngineTraits(max_k=8)).params, EngineTraits(max_k=8), latency=latency
    )
    policy.observe(signal_record(0.6))
    decode_only = context(64)
    with_chunk = StepContext(
        now_s=0.0, num_running=64, num_waiting=50, num_context_tokens=1000 * 64, num_prefill_tokens=8192
    )
    assert [policy.score(with_chunk, g) for g in policy.gammas] == [policy.score(decode_only, g) for g in policy.gammas]
    assert policy.choose(with_chunk) == policy.choose(decode_only)


def test_low_confidence_lowers_gamma_under_the_tokens_objective() -> None:
    policy = make_policy("mlp:objective=tokens,gammas=0-2-4-6-8", EngineTraits(max_k=8))
    policy.observe(signal_record(0.95))
    high = policy.choose(context()).k
    policy.observe(signal_record(0.1))
    assert policy.predicted_acceptance(2) < 0.2 and policy.choose(context()).k < high


def test_without_signals_it_is_goodput_and_gammas_capped_by_engine() -> None:
    policy = make_policy("mlp", EngineTraits(max_k=3))
    assert policy.gammas == (2, 3)
    assert policy.choose(context()) == policy.fallback.choose(context())
    policy.observe(
        StepRecord(
            now_s=0.0,
            k=0,
            duration_s=0.01,
            num_running=4,
            num_context_tokens=4000,
            num_batched_tokens=4,
            num_draft_passes=1,
            num_emitted_tokens=4,
        )
    )
    assert policy.features is None


@pytest.mark.parametrize("spec", ["mlp", "mlp:gammas=1-2-3,objective=tokens,compression=nf4"])
def test_spec_round_trips(spec: str) -> None:
    policy = make_policy(spec, EngineTraits(max_k=8))
    rebuilt = make_policy(policy.spec, EngineTraits(max_k=8))
    assert type(rebuilt) is MlpPolicy and rebuilt.params == policy.params and rebuilt.spec == policy.spec


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("mlp:gammas=2-x", "gammas"),
        ("mlp:objective=speed", "objective"),
        ("mlp:compression=fp8", "compression"),
        ("mlp:latency_half_life_steps=-1", "latency_half_life_steps"),
    ],
)
def test_bad_params(spec: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        make_policy(spec, EngineTraits(max_k=8))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read it"),
        ("not json", "not an mlp weights file"),
        ("[1]", "not an mlp weights file"),
        (
            json.dumps({"format": "specserve-mlp-acceptance/1", "feature_names": list(FEATURE_NAMES)}),
            "missing field 'input_mean'",
        ),
    ],
)
def test_weights_param_errors_name_the_file(tmp_path, content, message) -> None:
    path = tmp_path / "weights.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=message) as caught:
        make_policy(f"mlp:weights={path}", EngineTraits(max_k=8))
    assert str(path) in str(caught.value)
