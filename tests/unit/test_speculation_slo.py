"""SloPolicy: AdaSpec — first-peak k, the TPOT SLO guard, trimming, early stop.

Worked example of the estimator (AdaSpec Eqs. 6-7, Algorithm 3): b = 2, c-bar = 0.6, k = 2 emits 2 * (1 + 0.6 + 0.36)
= 3.92 tokens; in a 10 ms step that is 392 tokens/s, and -1 if the TPOT SLO is 8 ms.
"""

from __future__ import annotations

import pytest

from specserve.speculation import EngineTraits, SloPolicy, StepContext, StepRecord, make_policy
from specserve.speculation.estimators.slo_efficiency import (
    SLO_VIOLATION,
    batch_expansion_context,
    slo_efficiency,
    uniform_efficiencies,
)
from specserve.speculation.estimators.step_latency import StepLatencyModel
from specserve.speculation.policies.parts.slo_search import eliminate_drafts, first_peak

# A fixed latency model: 6 ms + 60 us per verified token + 0.3 ms and 5 us per request per draft pass.
TRUE = (6e-3, 0.0, 60e-6, 0.3e-3, 5e-6)


def fixed_latency(coefficients=TRUE) -> StepLatencyModel:
    # A huge prior weight pins the fit to the prior: the tests control the latency exactly.
    return StepLatencyModel(prior=coefficients, prior_weight=1e12)


def slo_policy(spec: str = "slo", max_k: int = 8, coefficients=TRUE, **traits) -> SloPolicy:
    engine = EngineTraits(max_k=max_k, **traits)
    return SloPolicy(make_policy(spec, engine).params, engine, latency=fixed_latency(coefficients))


def context(num_running: int = 4, slo_tpot_s: float | None = None, request_ids: tuple[str, ...] = ()) -> StepContext:
    return StepContext(
        now_s=0.0,
        num_running=num_running,
        num_waiting=0,
        num_context_tokens=1000 * num_running,
        request_ids=request_ids,
        slo_tpot_s=slo_tpot_s,
    )


def step_s(k: int, num_running: int, coefficients=TRUE) -> float:
    c0, _, c2, c3, c4 = coefficients
    passes = max(k, 1)  # k = 0 still syncs the draft (EngineTraits default)
    return c0 + c2 * num_running * (k + 1) + c3 * passes + c4 * passes * num_running


def test_estimator_worked_example() -> None:
    emitted = 2 * (1 + 0.6 + 0.36)
    assert slo_efficiency(emitted, 0.010, None, speculating=True) == pytest.approx(392.0)
    assert slo_efficiency(emitted, 0.010, 0.008, speculating=True) == SLO_VIOLATION
    assert slo_efficiency(2.0, 0.010, 0.008, speculating=False) == pytest.approx(200.0)  # k = 0 is exempt
    effs = uniform_efficiencies(2, 0.6, 2, lambda passes, verified: 0.010, None)
    assert effs == pytest.approx([200.0, 320.0, 392.0])


def test_first_peak_rules() -> None:
    assert first_peak([1.0, 1.0, 5.0]) == 0  # the pre-check needs f(1) > f(0) strictly
    assert first_peak([1.0, 2.0, 2.0, 1.5, 9.0]) == 2  # ties continue, the first drop stops
    assert first_peak([1.0, 2.0, SLO_VIOLATION, 3.0]) == 1  # an SLO violation is a drop


def test_k_falls_with_batch_size_and_is_the_argmax_of_the_model() -> None:
    policy = slo_policy()
    ks = [policy.choose(context(b)).k for b in (1, 16, 128)]
    assert ks[0] > ks[1] > ks[2]
    for b, k in zip((1, 16, 128), ks, strict=True):
        effs = [b * sum(0.6**j for j in range(kk + 1)) / step_s(kk, b) for kk in range(9)]
        assert k == max(range(9), key=lambda kk: (effs[kk], -kk))


@pytest.mark.parametrize("num_running", [1, 4, 16, 64])
@pytest.mark.parametrize("slo_ms", [7.0, 8.0, 9.5, 12.0, 20.0])
def test_never_picks_a_k_that_breaks_the_slo_when_one_complies(num_running: int, slo_ms: float) -> None:
    policy = slo_policy("slo:trim=false")
    k = policy.choose(context(num_running, slo_tpot_s=slo_ms / 1000)).k
    if k > 0:
        assert step_s(k, num_running) <= slo_ms / 1000
    unconstrained = slo_policy("slo:trim=false").choose(context(num_running)).k
    assert k <= unconstrained
    if step_s(unconstrained, num_running) <= slo_ms / 1000:
        assert k == unconstrained  # a slack SLO changes nothing


def test_slo_none_is_plain_goodput_and_tight_slo_binds() -> None:
    policy = slo_policy()
    assert policy.choose(context(1)).k == 4
    # At B = 1, k = 2 takes 6 + 0.18 + 0.61 = 6.79 ms and k = 3 takes 7.155 ms: a 7 ms SLO allows 2.
    assert policy.choose(context(1, slo_tpot_s=0.007)).k == 2
    assert policy.num_slo_bound == 1
    # The authors' released code, guard commented out: the SLO changes nothing.
    assert slo_policy("slo:guard=false").choose(context(1, slo_tpot_s=0.007)).k == 4


def test_prefill_chunk_is_not_charged_to_k() -> None:
    """A chunk rides along whatever k is (goodput's module docstring). At B = 128 with c-bar 0.6 the model gives
    k = 1; charging 8192 prefill tokens (0.49 s here) to T would amortise them over the drafts and give k = 6."""
    ids = tuple(f"r{i}" for i in range(128))
    plain, chunked = slo_policy(), slo_policy()
    decode_only = context(128, request_ids=ids)
    with_chunk = StepContext(
        now_s=0.0,
        num_running=128,
        num_waiting=50,
        num_context_tokens=1000 * 128,
        num_prefill_tokens=8192,
        request_ids=ids,
    )
    assert plain.choose(decode_only) == chunked.choose(with_chunk)
    efficiency = "predicted_efficiency_tokens_per_s"
    assert plain.describe()[efficiency] == chunked.describe()[efficiency]
    assert plain.choose(decode_only).k <= 1
    # The SLO guard checks the decode part only: a 30 ms SLO that the chunked step as a whole breaks (k = 0 when
    # the chunk was charged) binds k exactly as it does without the chunk.
    slo = dict(slo_tpot_s=0.030)
    assert slo_policy().choose(context(128, request_ids=ids, **slo)) == slo_policy().choose(
        StepContext(
            now_s=0.0,
            num_running=128,
            num_waiting=50,
            num_context_tokens=1000 * 128,
            num_prefill_tokens=8192,
            request_ids=ids,
            **slo,
        )
    )


def test_early_stop_fires_below_the_break_even_confidence() -> None:
    policy = slo_policy("slo:trim=false", asks_stop_drafting=True)
    decision = policy.choose(context(4))
    assert decision.k > 2
    stop = decision.draft_stop
    threshold = stop.break_even_confidence()
    assert 0.0 < threshold < 1.0
    assert stop.after_pass(0, threshold - 0.01) is True  # corrected f dropped below f(0)
    # Just above it the correction keeps f, but one more pass at c-bar is predicted not to pay: the predict
    # half stops. A confident pass continues.
    assert policy.choose(context(4)).draft_stop.after_pass(0, threshold + 0.01) is True
    assert policy.mean_confidence == 0.6
    stop = policy.choose(context(4)).draft_stop
    assert stop.after_pass(0, 0.9) is False
    assert stop.after_pass(1, 0.9) is False


def test_a_rule_only_where_the_engine_asks_and_only_for_a_speculative_step() -> None:
    assert slo_policy("slo:trim=false").choose(context(4)).draft_stop is None
    asked = slo_policy("slo:trim=false", asks_stop_drafting=True)
    assert asked.choose(context(4)).draft_stop is not None
    assert asked.choose(context(0)).k == 0 and asked.choose(context(0)).draft_stop is None


def test_early_stop_at_the_chosen_k_and_dropped_pass_stays_out_of_mean_confidence() -> None:
    policy = slo_policy("slo:trim=false", asks_stop_drafting=True)
    decision = policy.choose(context(4))
    assert [decision.draft_stop.after_pass(j, 0.99) for j in range(decision.k)][-1] is True
    stop = policy.choose(context(4)).draft_stop
    assert stop.after_pass(0, 0.9) is False
    assert stop.after_pass(1, 0.01) is True  # f dropped at position 1
    record = StepRecord(
        now_s=0.0,
        k=2,
        duration_s=0.01,
        num_running=1,
        num_context_tokens=1000,
        num_batched_tokens=3,
        num_draft_passes=2,
        num_emitted_tokens=2,
        num_drafted_per_request=(2,),
        num_accepted_per_request=(1,),
        request_ids=("a",),
        draft_confidence_per_request=((0.9, 0.01),),
    )
    policy.observe(record)
    assert policy.mean_confidence == pytest.approx(0.9)  # the 0.01 of the dropped pass is excluded
    policy.observe(record)  # the next step had no rule that saw a drop: every confidence counts
    assert policy.mean_confidence == pytest.approx((0.9 + 0.9 + 0.01) / 3)


def test_elimination_drops_only_unlikely_drafts() -> None:
    # 60 us per verified token against ~2000 tokens/s: a draft below P ~ 0.12 costs more than it yields.
    def seconds(passes: int, verified: int) -> float:
        return 6e-3 + 60e-6 * verified + 1e-3 * passes + 20e-6 * passes * 4

    lengths, _ = eliminate_drafts([0.9, 0.9, 0.9, 0.2], 3, seconds)
    assert lengths[:3] == [3, 3, 3] and lengths[3] < 3
    assert eliminate_drafts([0.9] * 4, 3, seconds)[0] == [3, 3, 3, 3]


def test_trimming_caps_low_confidence_requests() -> None:
    policy = slo_policy()
    ids = ("good", "bad")
    record = StepRecord(
        now_s=0.0,
        k=3,
        duration_s=0.01,
        num_running=2,
        num_context_tokens=2000,
        num_batched_tokens=8,
        num_draft_passes=3,
        num_emitted_tokens=5,
        num_drafted_per_request=(3, 3),
        num_accepted_per_request=(3, 0),
        request_ids=ids,
        draft_confidence_per_request=((0.95, 0.95, 0.95), (0.1, 0.1, 0.1)),
    )
    policy.observe(record)
    decision = policy.choose(context(2, request_ids=ids))
    caps = dict(decision.max_k_per_request)
    assert "good" not in caps and caps["bad"] < decision.k
    untrimmed = slo_policy("slo:trim=false")
    untrimmed.observe(record)
    assert untrimmed.choose(context(2, request_ids=ids)).max_k_per_request == ()


def test_no_draft_or_no_requests_means_zero_and_engine_caps_k() -> None:
    policy = slo_policy(max_k=2)
    assert policy.max_k == 2 and policy.choose(context(1)).k == 2
    absent = StepContext(now_s=0.0, num_running=4, num_waiting=0, num_context_tokens=4000, draft_resident=False)
    assert policy.choose(absent).k == 0 and policy.choose(context(0)).k == 0


@pytest.mark.parametrize("spec", ["slo", "slo:max_k=4,default_confidence=0.7,trim=false"])
def test_spec_round_trips(spec: str) -> None:
    policy = make_policy(spec, EngineTraits(max_k=8))
    rebuilt = make_policy(policy.spec, EngineTraits(max_k=8))
    assert type(rebuilt) is SloPolicy and rebuilt.params == policy.params and rebuilt.spec == policy.spec


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("slo:max_k=-1", "max_k"),
        ("slo:default_confidence=1.5", "default_confidence"),
        ("slo:latency_half_life_steps=0", "latency_half_life_steps"),
        ("slo:trim=maybe", "trim"),
    ],
)
def test_bad_params(spec: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        make_policy(spec, EngineTraits(max_k=8))


def test_batch_expansion_context_is_eq4() -> None:
    # (k + 1) * C + b * k (k + 1) / 2 with C = 1000 cached tokens over b = 2 requests, k = 3.
    assert batch_expansion_context(1000, 2, 3) == 4 * 1000 + 2 * 3 * 4 / 2
    assert batch_expansion_context(1000, 2, 0) == 1000


def test_on_a_batch_expansion_engine_context_prices_every_draft() -> None:
    """Under batch expansion each draft re-reads the request's KV: with a context cost that dominates, k falls."""
    kv_bound = (6e-3, 2e-6, 60e-6, 0.3e-3, 5e-6)
    plain, expanded = slo_policy(coefficients=kv_bound), slo_policy(coefficients=kv_bound, batch_expansion=True)
    k_plain, k_expanded = plain.choose(context(4)).k, expanded.choose(context(4)).k
    assert k_expanded < k_plain

    # f(k) under Eq. 4 at b = 4, C = 4000, c-bar = 0.6: the expanded policy's k is its first peak.
    def f(k: int) -> float:
        c0, c1, c2, c3, c4 = kv_bound
        step_s = c0 + c1 * batch_expansion_context(4000, 4, k) + c2 * 4 * (k + 1) + c3 * max(k, 1) + c4 * max(k, 1) * 4
        return 4 * sum(0.6**j for j in range(k + 1)) / step_s

    assert k_expanded == first_peak([f(k) for k in range(9)])


def test_on_a_batch_expansion_engine_the_fit_learns_from_eq4_context() -> None:
    """Observed steps are fitted with the context batch expansion read, so the fit recovers the per-token cost."""
    truth = (6e-3, 2e-6, 0.0, 0.0, 0.0)
    policy = make_policy("slo", EngineTraits(max_k=4, batch_expansion=True))
    for step in range(400):
        b, k, cached = 1 + step % 7, step % 5, 500 * (1 + step % 11)
        read = batch_expansion_context(cached, b, k) if k else cached
        policy.observe(
            StepRecord(
                now_s=0.0,
                k=k,
                duration_s=truth[0] + truth[1] * read,
                num_running=b,
                num_context_tokens=cached,
                num_batched_tokens=b * (k + 1),
                num_draft_passes=max(k, 1),
                num_emitted_tokens=b,
                num_drafted_per_request=(k,) * b if k else (),
                num_accepted_per_request=(0,) * b if k else (),
            )
        )
    assert policy.describe()["latency_s_per_context_token"] == pytest.approx(truth[1], rel=0.02)
