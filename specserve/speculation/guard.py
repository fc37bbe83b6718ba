"""A guard around a policy: a policy that fails or answers nonsense costs speed, never the engine.

Policies run inside the engine's step loop (and the simulator's), and users can plug in their own
(``--policy-module``). An exception there would take the EngineCore down with every request in it; a k
outside 0..max_k would make vLLM size buffers it does not have. The guard answers such a step with k = 0,
which is always lossless (the target decodes alone), counts the error by where it happened, logs it
(the first of each kind with its traceback, then one line per kind at most every ``LOG_INTERVAL_S``
with how many were not logged) and lets the next step ask the policy again.

It keeps asking a policy that failed, every step, for good: a policy that fails on one rare context keeps
controlling k everywhere else, a failure costs microseconds against a step of milliseconds, and k = 0 loses
nothing but speed. Swapping in a fallback after so many failures would hide a broken policy behind numbers
that look healthy; the counter (``specserve_policy_errors_total``) and the log say it is broken, and
``specserve policy set`` replaces it.

The engine (``replicas/core/scheduler.py``) and the simulator (``sim/replica.py``) both call their policy
through this class, so a policy misbehaves the same way in both.
"""

from __future__ import annotations

import logging
import math
import numbers
import time
from collections import Counter
from collections.abc import Callable, Sequence

from specserve.speculation.policy import Policy
from specserve.speculation.types import Decision, DraftStop, StepContext, StepRecord

# Where an error happened: the label of the errors metric.
CHOOSE = "choose"  # choose raised (or the step's draft-stop rule did)
OBSERVE = "observe"  # observe or warm_start raised
BAD_K = "bad_k"  # choose returned something that is not a Decision with an int k in 0..max_k and sane caps
DESCRIBE = "describe"  # describe raised or reported a non-finite estimate (dropped from telemetry)
WHERE = (CHOOSE, OBSERVE, BAD_K, DESCRIBE)

# Seconds between two log lines about the same kind of error; the metric counts every one.
LOG_INTERVAL_S = 60.0

SAFE = Decision(k=0)

_log = logging.getLogger(__name__)


class GuardedPolicy:
    """Calls ``policy`` and turns its failures into k = 0 steps, counted in ``errors`` by ``WHERE``."""

    def __init__(
        self,
        policy: Policy,
        logger: logging.Logger | logging.LoggerAdapter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.errors: Counter[str] = Counter()
        self._log = logger or _log
        self._clock = clock
        self._logged_at: dict[str, float] = {}
        self._unlogged: Counter[str] = Counter()

    @property
    def spec(self) -> str:
        return self.policy.spec

    def swap(self, policy: Policy, history: Sequence[StepRecord] = ()) -> None:
        """Run ``policy`` from now on, warm-started on ``history``; the error counts go on (they are cumulative)."""
        self.policy = policy
        self.warm_start(history)

    def choose(self, ctx: StepContext) -> Decision:
        try:
            decision = self.policy.choose(ctx)
        except Exception as exc:
            self._failed(CHOOSE, f"choose raised {exc!r}", exc)
            return SAFE
        problem = _check(decision, self.policy.traits.max_k, ctx)
        if problem:
            self._failed(BAD_K, problem)
            return SAFE
        k = int(decision.k)
        if decision.draft_stop is not None:
            return Decision(k, decision.max_k_per_request, _GuardedStop(self, decision.draft_stop))
        return decision if type(decision.k) is int else Decision(k, decision.max_k_per_request)

    def observe(self, record: StepRecord) -> None:
        try:
            self.policy.observe(record)
        except Exception as exc:
            self._failed(OBSERVE, f"observe raised {exc!r}", exc)

    def warm_start(self, history: Sequence[StepRecord]) -> None:
        try:
            self.policy.warm_start(history)
        except Exception as exc:
            self._failed(OBSERVE, f"warm_start raised {exc!r}", exc)

    def seed_acceptance(self, accepted: Sequence[float], reached: Sequence[float]) -> None:
        try:
            self.policy.seed_acceptance(accepted, reached)
        except Exception as exc:
            self._failed(OBSERVE, f"seed_acceptance raised {exc!r}", exc)

    def describe(self) -> dict[str, float]:
        try:
            info = self.policy.describe()
        except Exception as exc:
            self._failed(DESCRIBE, f"describe raised {exc!r}", exc)
            return {}
        # NaN is not JSON, and an infinite estimate says nothing an operator can use.
        finite = {name: value for name, value in info.items() if _finite(value)}
        if len(finite) < len(info):
            bad = sorted(set(info) - set(finite))
            self._failed(DESCRIBE, f"describe reported non-finite estimates {bad}")
        return finite

    def _failed(self, where: str, detail: str, exc: BaseException | None = None) -> None:
        self.errors[where] += 1
        now = self._clock()
        last = self._logged_at.get(where)
        if last is not None and now - last < LOG_INTERVAL_S:
            self._unlogged[where] += 1
            return
        self._logged_at[where] = now
        unlogged, self._unlogged[where] = self._unlogged[where], 0
        self._log.warning(
            "specserve: policy %s failed (%s): %s; the step ran at k=0%s",
            self.policy.spec,
            where,
            detail,
            f" ({unlogged} more {where} errors since the last line)" if unlogged else "",
            # The traceback once per kind: it is the same every time, and would flood the log.
            exc_info=exc if last is None else None,
        )


class _GuardedStop:
    """The step's draft-stop rule; if it raises, drafting stops there (verifying fewer drafts is lossless)."""

    def __init__(self, guard: GuardedPolicy, rule: DraftStop) -> None:
        self._guard = guard
        self._rule = rule

    def after_pass(self, position: int, confidence: float) -> bool:
        try:
            return bool(self._rule.after_pass(position, confidence))
        except Exception as exc:
            self._guard._failed(CHOOSE, f"draft_stop.after_pass raised {exc!r}", exc)
            return True


def _check(decision: object, max_k: int, ctx: StepContext) -> str:
    """Why ``decision`` cannot run on an engine with ``max_k``, or '' if it can."""
    if not isinstance(decision, Decision):
        return f"choose returned {decision!r}, not a Decision"
    k = decision.k
    if not _is_int(k) or not 0 <= k <= max_k:
        return f"choose returned k={k!r}, not an int in 0..{max_k}"
    if not decision.max_k_per_request:
        return ""
    running = set(ctx.request_ids)
    for item in decision.max_k_per_request:
        rid, cap = item if isinstance(item, tuple) and len(item) == 2 else (item, None)
        if not _is_int(cap) or cap < 0 or (running and rid not in running):
            return f"choose capped request {rid!r} at {cap!r}: not a running request or not an int >= 0"
    return ""


def _is_int(value: object) -> bool:
    # numpy's integers count; bool is an int to Python but never a k. Checked every step: plain ints first.
    return type(value) is int or (isinstance(value, numbers.Integral) and not isinstance(value, bool))


def _finite(value: object) -> bool:
    return isinstance(value, numbers.Real) and math.isfinite(value)
