"""adaptive's per-request caps (parts.per_request): each request's own acceptance, and the drafts each is worth."""

from __future__ import annotations

import random

import numpy as np
import pytest
from speculation_synthetic import draw_accepted, kinked_steps, roofline_s

from specserve.speculation import EngineTraits, StepContext, StepRecord, make_policy
from specserve.speculation.policies.adaptive import AdaptivePolicy
from specserve.speculation.policies.parts.per_request import RequestAcceptance, prior_samples

# Past the synthetic step's ridge (200 tokens) once drafting: a draft costs its verification there.
BATCH = 64


def fitted(spec: str) -> AdaptivePolicy:
    policy = make_policy(spec, EngineTraits(max_k=6))
    assert isinstance(policy, AdaptivePolicy)
    for step in kinked_steps(2000):
        policy.latency.observe(step)
    return policy


def step(ids: list[str], alphas: list[float], k: int, rng: random.Random) -> StepRecord:
    accepted = tuple(draw_accepted(rng, alpha, k) for alpha in alphas)
    batch = len(ids)
    return StepRecord(
        now_s=0.0,
        k=k,
        duration_s=roofline_s(batch * (k + 1), k, batch),
        num_running=batch,
        num_context_tokens=0,
        num_batched_tokens=batch * (k + 1),
        num_draft_passes=k,
        num_emitted_tokens=batch + sum(accepted),
        num_drafted_per_request=(k,) * batch,
        num_accepted_per_request=accepted,
        request_ids=tuple(ids),
    )


def context(ids: list[str], now_s: float = 0.0) -> StepContext:
    return StepContext(now_s=now_s, num_running=len(ids), num_waiting=0, num_context_tokens=0, request_ids=tuple(ids))


def requests_of(policy: AdaptivePolicy) -> RequestAcceptance:
    assert policy.requests is not None
    return policy.requests


def cap_of(decision, request_id: str) -> int:
    return dict(decision.max_k_per_request).get(request_id, decision.k)


MIXED = [f"copy-{i}" for i in range(BATCH // 2)] + [f"free-{i}" for i in range(BATCH // 2)]
MIXED_ALPHAS = [0.95] * (BATCH // 2) + [0.2] * (BATCH // 2)


def mixed_policy(spec: str = "adaptive:per_request=true") -> AdaptivePolicy:
    policy, rng = fitted(spec), random.Random(3)
    for _ in range(60):
        policy.observe(step(MIXED, MIXED_ALPHAS, 6, rng))
    return policy


def test_a_request_that_accepts_more_gets_a_larger_cap() -> None:
    decision = mixed_policy().choose(context(MIXED))
    copy_caps = [cap_of(decision, rid) for rid in MIXED[: BATCH // 2]]
    free_caps = [cap_of(decision, rid) for rid in MIXED[BATCH // 2 :]]
    assert decision.k == max(copy_caps + free_caps) > 0
    assert min(copy_caps) > max(free_caps)


def test_one_batch_k_drafts_every_request_alike() -> None:
    decision = mixed_policy("adaptive:per_request=false").choose(context(MIXED))
    assert decision.max_k_per_request == ()


def test_a_request_without_evidence_of_its_own_is_priced_as_the_batch() -> None:
    policy = mixed_policy()
    acceptance = policy.core.acceptance
    ids = [*MIXED, "newcomer"]
    survival = requests_of(policy).survival(ids, acceptance.alphas(), acceptance.num_reached(), policy.max_k)
    assert survival is not None
    assert survival[-1] == pytest.approx(np.cumprod(acceptance.alphas()[: policy.max_k]))
    # The copy-heavy requests' own evidence puts them above the batch, the free-form ones below it.
    assert (survival[0] > survival[-1]).all() and (survival[BATCH - 1] < survival[-1]).all()


def test_thin_evidence_moves_a_request_less_than_ample_evidence() -> None:
    requests = RequestAcceptance(half_life_steps=20.0)
    alphas, reached = [0.5, 0.8, 0.85, 0.9], [400.0, 200.0, 150.0, 120.0]
    requests.observe(StepRecord(0.0, 4, 0.01, 2, 0, 10, 4, 3, (4, 4), (0, 0), request_ids=("thin", "ample")))
    for _ in range(30):
        requests.observe(StepRecord(0.0, 4, 0.01, 1, 0, 5, 4, 1, (4,), (0,), request_ids=("ample",)))
    survival = requests.survival(["thin", "ample", "none"], alphas, reached, 4)
    assert survival is not None
    assert survival[1, 0] < survival[0, 0] < survival[2, 0]


def test_a_batch_whose_requests_accept_alike_keeps_the_batch_prices() -> None:
    # alpha_1 no higher than alpha_0: the requests that accepted position 0 are no better than the rest.
    assert prior_samples([0.7, 0.69, 0.7], [500.0, 350.0, 240.0]) is None
    assert prior_samples([0.45, 0.8, 0.85], [500.0, 220.0, 170.0]) is not None


def test_a_request_that_leaves_is_forgotten() -> None:
    policy = mixed_policy()
    assert "free-0" in requests_of(policy).tracked()
    staying = [rid for rid in MIXED if rid != "free-0"]
    policy.choose(context(staying))
    assert "free-0" not in requests_of(policy).tracked()
    # Back under the same id, it is a newcomer: priced as the batch, not as the free-form request it was.
    acceptance = policy.core.acceptance
    survival = requests_of(policy).survival(MIXED, acceptance.alphas(), acceptance.num_reached(), policy.max_k)
    assert survival is not None
    assert survival[MIXED.index("free-0")] == pytest.approx(np.cumprod(acceptance.alphas()[: policy.max_k]))
    assert (survival[MIXED.index("free-1")] < survival[MIXED.index("free-0")]).all()


def test_requests_that_accept_alike_choose_exactly_what_one_batch_k_chooses() -> None:
    per_request, batch = fitted("adaptive:per_request=true"), fitted("adaptive:per_request=false")
    rng, ids = random.Random(5), [f"r{i}" for i in range(BATCH)]
    for t in range(300):
        ctx = context(ids, now_s=0.05 * t)
        decisions = per_request.choose(ctx), batch.choose(ctx)
        assert decisions[0].k == decisions[1].k and decisions[0].max_k_per_request == ()
        k = max(decisions[0].k, 1)
        # Every request accepts the same prefix each step: they accept alike, step after step.
        accepted = draw_accepted(rng, 0.7, k)
        record = step(ids, [0.0] * BATCH, k, rng)
        record = StepRecord(
            **{**{f: getattr(record, f) for f in record.__slots__}, "num_accepted_per_request": (accepted,) * BATCH}
        )
        per_request.observe(record)
        batch.observe(record)
