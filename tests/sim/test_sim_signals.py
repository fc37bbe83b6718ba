"""Draft-side signals, request ids, per-request caps and early stop in the simulator (signals.py, drafting.py).

The test policies are not registered by name (the registry is global, so registering at import would make the
tests depend on import order): each run gets a factory that builds them, ``simulate``'s other form of policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from sim_helpers import small_scenario

from specserve.sim import StepStats, simulate, summarize
from specserve.sim.config import SignalsConfig
from specserve.sim.signals import SignalModel
from specserve.speculation import Decision, EngineTraits, Policy, StepContext, StepRecord


@dataclass(frozen=True, slots=True)
class _NoParams:
    pass


class CapByIdPolicy(Policy):
    """k = 3 with request r capped at int(r) % 4 drafts; remembers every context it saw."""

    name = "test-cap-by-id"
    Params = _NoParams

    def __init__(self, params: _NoParams, traits) -> None:
        super().__init__(params, traits)
        self.contexts: list[StepContext] = []

    def choose(self, ctx: StepContext) -> Decision:
        self.contexts.append(ctx)
        return Decision(k=3, max_k_per_request=tuple((rid, int(rid) % 4) for rid in ctx.request_ids))


class StopAfterTwoPolicy(Policy):
    """k = 4, but stops the draft loop after the pass at position 1; logs its calls per step."""

    name = "test-stop-after-two"
    Params = _NoParams

    def __init__(self, params: _NoParams, traits) -> None:
        super().__init__(params, traits)
        self.calls: list[tuple[int, float]] = []
        self.steps: list[tuple[StepRecord, list[tuple[int, float]]]] = []

    def choose(self, ctx: StepContext) -> Decision:
        self.calls = []
        return Decision(k=4, draft_stop=self)

    def after_pass(self, position: int, confidence: float) -> bool:
        self.calls.append((position, confidence))
        return position >= 1

    def observe(self, record: StepRecord) -> None:
        self.steps.append((record, self.calls))


def cap_by_id(traits: EngineTraits) -> CapByIdPolicy:
    return CapByIdPolicy(_NoParams(), traits)


def stop_after_two(traits: EngineTraits) -> StopAfterTwoPolicy:
    return StopAfterTwoPolicy(_NoParams(), traits)


def run_logged(scenario, policy, seed: int = 0):
    steps: list[tuple[StepRecord, StepStats]] = []
    result = simulate(scenario, policy, seed, on_step=lambda record, stats: steps.append((record, stats)))
    return result, steps


def flat_signals(steps):
    """Per drafted position: (confidence, entropy, kl, verdict) with verdict 1 accepted, 0 first rejected,
    -1 past the first rejection (its verdict is unobserved)."""
    rows = []
    for record, _ in steps:
        for conf, ent, kl, accepted in zip(
            record.draft_confidence_per_request,
            record.draft_entropy_per_request,
            record.kl_per_request,
            record.num_accepted_per_request,
            strict=True,
        ):
            rows.extend(
                (c, h, d, 1 if j < accepted else 0 if j == accepted else -1)
                for j, (c, h, d) in enumerate(zip(conf, ent, kl, strict=True))
            )
    return np.array(rows)


def test_signal_model_worked_example() -> None:
    # kappa = 4, mu = 0.7: c ~ Beta(2.8, 1.2), so E[c] = 0.7, E[c | accepted] = 3.8 / 5 = 0.76 and
    # E[c | rejected] = 2.8 / 5 = 0.56; P(accepted | c) = c (a calibrated draft, AdaSpec Eq. 7).
    rng = np.random.default_rng(0)
    probs = np.full((200_000, 1), 0.7)
    passed = rng.random(probs.shape) < probs
    s = SignalModel(SignalsConfig()).sample(probs, passed, rng)
    c = s.confidence[:, 0]
    assert c.mean() == pytest.approx(0.7, abs=0.005)
    assert c[passed[:, 0]].mean() == pytest.approx(0.76, abs=0.005)
    assert c[~passed[:, 0]].mean() == pytest.approx(0.56, abs=0.005)
    low, high = c < 0.4, c > 0.9
    assert passed[low, 0].mean() == pytest.approx(c[low].mean(), abs=0.02)
    assert passed[high, 0].mean() == pytest.approx(c[high].mean(), abs=0.02)
    # Entropy and KL are non-negative and fall as confidence rises.
    assert (s.entropy_nats >= 0).all() and (s.kl_nats >= 0).all()
    assert s.entropy_nats[high].mean() < s.entropy_nats[low].mean()
    assert s.kl_nats[high].mean() < s.kl_nats[low].mean()
    # KL's mean is Pinsker's 2 (1 - c)^2.
    assert s.kl_nats.mean() == pytest.approx(2 * ((1 - c) ** 2).mean(), rel=0.02)


def test_signals_are_aligned_and_in_range() -> None:
    result, steps = run_logged(small_scenario(), "fixed:k=3")
    num_speculative = 0
    for record, _ in steps:
        n = len(record.num_drafted_per_request)
        assert len(record.request_ids) == n
        assert len(record.draft_confidence_per_request) == len(record.draft_entropy_per_request) == n
        assert len(record.kl_per_request) == n
        for conf, ent, kl, drafted in zip(
            record.draft_confidence_per_request,
            record.draft_entropy_per_request,
            record.kl_per_request,
            record.num_drafted_per_request,
            strict=True,
        ):
            assert len(conf) == len(ent) == len(kl) == drafted
            assert all(0 < c < 1 for c in conf)
            assert all(h >= 0 for h in ent) and all(d >= 0 for d in kl)
        num_speculative += n > 0
    assert num_speculative > 100
    ids = {rid for record, _ in steps for rid in record.request_ids}
    assert ids <= {str(i) for i in range(len(result.table.arrival_s))}


def test_accepted_drafts_look_confident_and_close_to_the_target() -> None:
    _, steps = run_logged(small_scenario(), "fixed:k=3")
    rows = flat_signals(steps)
    accepted, rejected = rows[rows[:, 3] == 1], rows[rows[:, 3] == 0]
    assert len(accepted) > 1000 and len(rejected) > 300
    assert accepted[:, 0].mean() > rejected[:, 0].mean() + 0.1  # confidence
    assert accepted[:, 1].mean() < rejected[:, 1].mean()  # entropy
    assert accepted[:, 2].mean() < rejected[:, 2].mean()  # KL
    observed = rows[rows[:, 3] >= 0]
    assert np.corrcoef(observed[:, 0], observed[:, 3])[0, 1] > 0.3


def test_signals_off_change_no_verdict() -> None:
    # Verdicts come from their own stream and signals from another, so both runs accept the same drafts.
    on = simulate(small_scenario(), "fixed:k=3", 5)
    off, off_steps = run_logged(small_scenario(acceptance={"signals": {"enabled": False}}), "fixed:k=3", 5)
    assert on.replicas[0].num_accepted == off.replicas[0].num_accepted
    assert on.replicas[0].series_time_s == off.replicas[0].series_time_s
    assert all(not r.draft_confidence_per_request and not r.kl_per_request for r, _ in off_steps)
    assert any(r.request_ids for r, _ in off_steps)  # ids are not signals


def test_context_carries_request_ids_and_the_tpot_slo() -> None:
    result = simulate(small_scenario(slo={"max_tpot_s": 0.02}), cap_by_id, 0)
    contexts = result.replicas[0].policy.contexts
    assert all(len(ctx.request_ids) == ctx.num_running for ctx in contexts)
    assert all(ctx.slo_tpot_s == 0.02 for ctx in contexts)
    assert all(ctx.slo_tpot_s is None for ctx in simulate(small_scenario(), cap_by_id, 0).replicas[0].policy.contexts)


def test_goodput_counts_requests_whose_mean_tpot_meets_the_slo() -> None:
    plain = summarize(simulate(small_scenario(), "fixed:k=2", 0))
    result = simulate(small_scenario(slo={"max_tpot_s": 0.0031}), "fixed:k=2", 0)
    summary, table = summarize(result), result.table
    tpot = (table.finish_s - table.first_token_s) / np.maximum(table.output_tokens - 1, 1)
    good = (tpot <= 0.0031) | (table.output_tokens <= 1)
    assert 0 < good.sum() < len(good)
    assert summary["goodput_tok_s"] == pytest.approx(table.num_output[good].sum() / result.end_s)
    assert summary["goodput_tok_s"] < summary["throughput_tok_s"] == plain["throughput_tok_s"]


def test_per_request_caps_are_honoured() -> None:
    result, steps = run_logged(small_scenario(), cap_by_id)
    num_capped = 0
    for record, _ in steps:
        for rid, drafted in zip(record.request_ids, record.num_drafted_per_request, strict=True):
            assert 1 <= drafted <= min(int(rid) % 4, 3)  # capped at 0: not drafting, so not listed
            num_capped += drafted < 3
        if record.num_drafted_per_request:
            assert record.num_draft_passes == max(record.num_drafted_per_request)
    assert num_capped > 100
    assert np.array_equal(result.table.num_output, result.table.output_tokens)


def test_stop_drafting_truncates_the_draft_loop() -> None:
    result, steps = run_logged(small_scenario(), stop_after_two)
    policy = result.replicas[0].policy
    speculative = [(record, calls) for record, calls in policy.steps if record.num_drafted_per_request]
    assert len(speculative) > 100
    for record, calls in speculative:
        assert max(record.num_drafted_per_request) <= 2
        assert record.num_draft_passes == max(record.num_drafted_per_request)
        # Asked once per pass run, in order, with the mean confidence of the requests drafting there.
        assert [p for p, _ in calls] == list(range(record.num_draft_passes))
        for position, confidence in calls:
            values = [conf[position] for conf in record.draft_confidence_per_request if len(conf) > position]
            assert confidence == pytest.approx(sum(values) / len(values))
    assert np.array_equal(result.table.num_output, result.table.output_tokens)


def test_early_stop_verifies_only_the_drafts_made() -> None:
    # Granted k = 4, stopped after 2 passes: a step of decodes only scores 1 + 2 tokens per request, not 1 + 4.
    def decode_steps(steps):
        return [r for r, _ in steps if r.num_drafted_per_request and len(r.num_drafted_per_request) == r.num_running]

    stopped = decode_steps(run_logged(small_scenario(), stop_after_two)[1])
    full = decode_steps(run_logged(small_scenario(), "fixed:k=4")[1])
    assert len(stopped) > 50 and len(full) > 50
    assert all(r.num_batched_tokens == r.num_running + r.num_drafted <= 3 * r.num_running for r in stopped)
    assert any(r.num_batched_tokens > 3 * r.num_running for r in full)


@pytest.mark.parametrize("policy", ["slo", "kld", "mlp"])
def test_signal_policies_no_longer_fall_back_to_goodput(policy: str) -> None:
    scenario = small_scenario(workload={"arrivals": {"kind": "poisson", "rate_qps": 8, "duration_s": 10}})
    base = simulate(scenario, "goodput", 0).replicas[0].series_k
    result = simulate(scenario, policy, 0)
    assert result.replicas[0].series_k != base
    described = result.replicas[0].policy.describe()
    if policy == "kld":
        assert described["kl_seen"] == 1.0
    elif policy == "mlp":
        assert described["signals_seen"] == 1.0
    else:
        assert described["mean_confidence"] != 0.6  # no longer the prior


@pytest.mark.parametrize(
    "policy", ["slo", "kld", "mlp", cap_by_id, stop_after_two], ids=["slo", "kld", "mlp", "cap-by-id", "stop-after-two"]
)
def test_invariants_hold_for_per_request_and_stopping_policies(policy) -> None:
    result, steps = run_logged(small_scenario(engine={"num_kv_blocks": 96}), policy)
    assert np.array_equal(result.table.num_output, result.table.output_tokens)
    assert all(0 <= stats.num_kv_blocks_used <= 96 for _, stats in steps)
    assert steps[-1][1].num_kv_blocks_used == 0
    for record, stats in steps:
        assert record.num_emitted_tokens == record.num_accepted + stats.num_sampled
        assert all(
            0 <= a <= d <= record.k
            for d, a in zip(record.num_drafted_per_request, record.num_accepted_per_request, strict=True)
        )
    again = simulate(small_scenario(engine={"num_kv_blocks": 96}), policy, 0)
    assert again.replicas[0].series_k == result.replicas[0].series_k
    assert again.replicas[0].series_time_s == result.replicas[0].series_time_s
