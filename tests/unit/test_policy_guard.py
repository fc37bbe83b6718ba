"""The policy guard: a policy that raises or answers nonsense costs a k = 0 step and a count, never the caller."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import pytest

from specserve.speculation import Decision, EngineTraits, GuardedPolicy, Policy, StepContext, make_policy, register
from specserve.speculation import policy as policy_registry
from specserve.speculation.guard import LOG_INTERVAL_S

TRAITS = EngineTraits(max_k=4)
CTX = StepContext(now_s=0.0, num_running=2, num_waiting=0, num_context_tokens=64, request_ids=("a", "b"))


@dataclass(frozen=True, slots=True)
class AnswerParams:
    k: float = 2


class AnswerPolicy(Policy):
    """Answers whatever k it is given (floats included), caps request "a" at ``cap`` when set."""

    name = "test-guard-answer"
    Params = AnswerParams
    cap: object = None
    cap_request = "a"

    def choose(self, ctx: StepContext) -> Decision:
        caps = ((self.cap_request, self.cap),) if self.cap is not None else ()
        return Decision(k=self.params.k, max_k_per_request=caps)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class NoParams:
    pass


class RaisingPolicy(Policy):
    name = "test-guard-raising"
    Params = NoParams

    def choose(self, ctx: StepContext) -> Decision:
        raise ZeroDivisionError("choose")

    def observe(self, record) -> None:
        raise KeyError("observe")

    def describe(self) -> dict[str, float]:
        raise RuntimeError("describe")


@pytest.fixture(autouse=True)
def broken_policies(monkeypatch):
    """Registered by name as a user's module registers them, for this module's tests only: the registry is global,
    and other tests run every registered policy."""
    monkeypatch.setattr(policy_registry, "_REGISTRY", dict(policy_registry._REGISTRY))
    register(AnswerPolicy)
    register(RaisingPolicy)


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def guarded(spec: str, clock: Clock | None = None) -> GuardedPolicy:
    return GuardedPolicy(make_policy(spec, TRAITS), logging.getLogger("test-guard"), clock or Clock())


@pytest.mark.parametrize("k", [99, -1, math.nan, math.inf, 2.0])
def test_a_k_outside_the_engine_or_not_an_int_runs_the_step_at_k0_and_is_counted(k):
    guard = guarded(f"test-guard-answer:k={k}")
    assert guard.choose(CTX) == Decision(k=0)
    assert guard.errors == {"bad_k": 1}


def test_a_numpy_integer_k_is_a_sane_answer_and_reaches_the_engine_as_an_int():
    guard = guarded("test-guard-answer")
    guard.policy.params = AnswerParams(k=np.int64(4))  # type: ignore[arg-type]
    decision = guard.choose(CTX)
    assert decision.k == 4 and type(decision.k) is int
    assert not guard.errors


@pytest.mark.parametrize(("request_id", "cap"), [("a", -1), ("a", math.nan), ("gone", 1)])
def test_a_cap_below_zero_not_an_int_or_on_a_request_not_running_is_a_bad_answer(request_id, cap):
    guard = guarded("test-guard-answer:k=3")
    guard.policy.cap, guard.policy.cap_request = cap, request_id  # type: ignore[attr-defined]
    assert guard.choose(CTX) == Decision(k=0)
    assert guard.errors == {"bad_k": 1}


def test_exceptions_in_choose_observe_and_describe_are_absorbed_and_counted_where_they_happened():
    guard = guarded("test-guard-raising")
    assert guard.choose(CTX) == Decision(k=0)
    guard.observe(None)  # type: ignore[arg-type]
    guard.warm_start([None])  # type: ignore[list-item]
    assert guard.describe() == {}
    assert guard.errors == {"choose": 1, "observe": 2, "describe": 1}


def test_non_finite_estimates_are_dropped_from_describe():
    guard = guarded("fixed:k=2")
    guard.policy.describe = lambda: {"alpha": math.nan, "cost": math.inf, "k": 2.0}  # type: ignore[method-assign]
    assert guard.describe() == {"k": 2.0}
    assert guard.errors == {"describe": 1}


def test_a_raising_draft_stop_rule_stops_drafting():
    class Rule:
        def after_pass(self, position: int, confidence: float) -> bool:
            raise ValueError("rule")

    guard = guarded("fixed:k=2")
    guard.policy.choose = lambda ctx: Decision(k=2, draft_stop=Rule())  # type: ignore[method-assign]
    stop = guard.choose(CTX).draft_stop
    assert stop is not None and stop.after_pass(0, 0.9) is True
    assert guard.errors == {"choose": 1}


def test_a_failing_policy_is_asked_again_every_step():
    # The guard keeps asking: a policy that fails on one context still controls k on the others.
    guard = guarded("test-guard-answer:k=3")
    for k in (99, 3, 99, 2):
        guard.policy.params = AnswerParams(k=k)
        assert guard.choose(CTX).k == (0 if k == 99 else k)
    assert guard.errors == {"bad_k": 2}


def test_errors_are_logged_once_per_interval_per_kind_with_the_count_left_out(caplog):
    clock = Clock()
    guard = guarded("test-guard-raising", clock)
    with caplog.at_level(logging.WARNING, logger="test-guard"):
        for _ in range(50):
            guard.choose(CTX)
            guard.observe(None)  # type: ignore[arg-type]
        assert len(caplog.records) == 2  # the first of each kind
        assert all(r.exc_info for r in caplog.records)
        clock.now_s = LOG_INTERVAL_S
        guard.choose(CTX)
    assert len(caplog.records) == 3
    assert "49 more choose errors" in caplog.records[-1].getMessage()
    assert guard.errors == {"choose": 51, "observe": 50}


def test_swapping_the_policy_keeps_the_counts():
    guard = guarded("test-guard-raising")
    guard.choose(CTX)
    guard.swap(make_policy("fixed:k=2", TRAITS))
    assert guard.choose(CTX) == Decision(k=2)
    assert guard.errors == {"choose": 1}
    assert guard.spec == "fixed:k=2"
