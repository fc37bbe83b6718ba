"""``adaptive`` on a held k = 0: a step re-priced only when its batch, the step-cost fit, the verdicts or the probes
moved, k = 0 steps without drafts learned from in one go, both against a twin that does neither; and the fit
refitted less often while k = 0 is the policy's own."""

from __future__ import annotations

import random
from collections.abc import Callable

from speculation_synthetic import draw_accepted, roofline_s
from test_adaptive import trained_policy

from specserve.speculation import StepContext, StepRecord
from specserve.speculation.estimators.step_latency import HINGED, StepLatencyModel
from specserve.speculation.policies.adaptive import REFIT_EVERY_STEPS, REFIT_EVERY_STEPS_AT_ZERO, AdaptivePolicy

CONTEXT_PER_REQUEST = 64


def batch_at(step: int) -> int:
    """Mostly a big batch (k = 0 pays best there), a small one for a while (speculation pays), a request that
    leaves and comes back, and a prompt every 16 steps."""
    if 300 <= step < 340:
        return 2
    return 255 if step % 40 == 7 else 256


def run(policy: AdaptivePolicy, steps: int, alpha: float, on_step: Callable[[AdaptivePolicy], None]) -> list[int]:
    """A closed loop: each step's context from ``batch_at``, its record from the k chosen (drafts accepted with
    ``alpha``); the k run per step."""
    rng = random.Random(5)
    ks = []
    for step in range(steps):
        batch, prefill = batch_at(step), 32 if step % 16 == 0 else 0
        now_s = 0.01 * step
        context = batch * CONTEXT_PER_REQUEST + step
        ctx = StepContext(now_s, batch, 0, context, prefill, request_ids=tuple(f"r{i}" for i in range(batch)))
        k = policy.choose(ctx).k
        ks.append(k)
        accepted = tuple(draw_accepted(rng, alpha, k) for _ in range(batch)) if k else ()
        passes = k if k else int(prefill > 0)
        policy.observe(
            StepRecord(
                now_s=now_s,
                k=k,
                duration_s=roofline_s(batch * (k + 1) + prefill, passes, batch),
                num_running=batch,
                num_context_tokens=context,
                num_batched_tokens=batch * (k + 1) + prefill,
                num_draft_passes=passes,
                num_emitted_tokens=batch + sum(accepted),
                num_drafted_per_request=(k,) * len(accepted),
                num_accepted_per_request=accepted,
            )
        )
        on_step(policy)
    return ks


def goodput(policy: AdaptivePolicy) -> float:
    return policy.core.last_goodput_tokens_per_s


def policy() -> AdaptivePolicy:
    return trained_policy("adaptive:probe_interval_s=0.5", alpha=0.8, resume_s_per_token=1e-6, drafts_ahead=True)


def test_learning_the_k0_steps_in_one_go_is_learning_each_at_once_to_the_bit() -> None:
    deferring, at_once = policy(), policy()
    at_once.latency.observes_until_refit = lambda: 1  # type: ignore[method-assign]
    held_back: list[int] = []
    # Each step's predicted goodput: priced from everything learned so far, to the bit, or it differs.
    prices: list[float] = []
    ks = run(deferring, 600, 0.8, lambda p: (held_back.append(len(p._deferred)), prices.append(goodput(p))))
    twin_prices: list[float] = []
    assert ks == run(at_once, 600, 0.8, lambda p: twin_prices.append(goodput(p)))
    assert prices == twin_prices
    assert max(held_back) >= 2  # steps were held back and learned from later
    assert deferring.describe() == at_once.describe()
    assert deferring.latency.coefficients() == at_once.latency.coefficients()


def test_a_held_k0_chooses_what_pricing_every_step_chooses_and_a_smaller_batch_is_priced_at_once() -> None:
    holding, pricing = policy(), policy()
    pricing._held_zero = lambda ctx: None  # type: ignore[method-assign]
    ks = run(holding, 600, 0.8, lambda p: None)
    assert ks == run(pricing, 600, 0.8, lambda p: None)
    # The big batch held k = 0 (but for probes and a prompt step); the small one speculated from its first step to
    # its last.
    assert ks[20:300].count(0) > ks[20:300].count(1) and 0 not in ks[300:340]
    assert holding.describe()["num_held_zero_steps"] > 0 and pricing.describe()["num_held_zero_steps"] == 0


def test_the_fit_refits_less_often_while_the_policy_holds_k0_than_while_it_speculates() -> None:
    holding = policy()
    versions: list[int] = []
    ks = run(holding, 340, 0.8, lambda p: versions.append(p.latency.fit_version))
    assert ks[100:300].count(0) > 150 and 0 not in ks[300:340]
    at_zero, speculating = versions[299] - versions[99], versions[339] - versions[299]
    assert at_zero <= 200 // REFIT_EVERY_STEPS_AT_ZERO + 1
    assert speculating >= 40 // REFIT_EVERY_STEPS - 1


def test_observes_until_refit_counts_the_steps_up_to_the_one_that_asks_for_a_refit() -> None:
    model = StepLatencyModel(HINGED, refit_every=8)
    record = StepRecord(0.0, 0, 0.01, 4, 100, 4, 0, 4)
    for _ in range(200):
        due, version = model.observes_until_refit(), model.fit_version
        for _ in range(due - 1):
            model.observe(record)
        assert model.fit_version == version  # none of the steps before it asked
        model.observe(record)
        assert model.fit_version == version + 1
        if model.num_samples > 100:
            model.coefficients()  # a refit now and then between the steps, as a pricing step makes one
