"""Acceptance collapse: tell a draft that broke from a workload whose acceptance is simply low, and say what to do.

The failure class (vLLM issue 52479, SGLang issue 31674, TensorRT-LLM PR 16888): after a memory operation (an
offload, a sleep/wake, a weight update) a draft's weights come back wrong. Output stays correct, because rejection
sampling verifies every draft, but almost nothing is accepted, so every speculating step costs more than plain
decoding. This module is the pure part (no ray, vllm or torch): the detector, ``AcceptanceCliff``, and the state
machine around it, ``CollapseMachine``. The engine carries the machine's wishes out
(``replicas/core/collapse_action.py``).

**What is measured.** First-position acceptance, one Bernoulli trial per request per step that verified at least
one draft: success when the first draft was accepted. A request's first draft is the one every speculating step
makes, so the trials come at the same rate whatever k is, and they are close to independent (one per request per
step), which is what makes a binomial test sound.

**Collapse versus low acceptance.** A collapse is a fall to near zero from an acceptance this replica had
established; low acceptance is low from the start, or declines gradually. So:

- The *baseline* is the replica's own first-position acceptance, decayed over ``half_life_trials`` trials and fed
  only with trials older than the test window (so a cliff inside the window is compared with what came before it).
  The detector is armed only once the baseline rests on ``baseline_trials`` trials and is at least
  ``min_baseline``: a draft that is poor from the start never arms it (what the policy is for: under ``adaptive``
  such a workload drives k to 0, and no trial means no test).
- The *floor* is ``ratio`` times the baseline. The window holds the latest trials, enough that zero successes would
  be significant (``trials_needed``) with half as many again to spare; the detector fires when, over the newest
  steps back to any point in the window, the binomial tail ``P(X <= successes | trials, floor)`` is at most
  ``confidence``: acceptance since then is below the floor, with that confidence. Scanning the window's tails
  tests several stretches a step, which only matters for acceptance right at the floor; acceptance at the baseline
  (four times the floor) is that far below it with a probability many orders smaller.
- *Suspicion* keeps the trials coming. Under ``adaptive`` the same rejections drive k to 0 within a few steps, and
  at k = 0 the only trials are the policy's probes, one step every few seconds: the test would need tens of
  seconds, with the broken draft left in place meanwhile. So once the latest trials are below the floor at the
  weaker ``suspect_confidence`` (two probes' worth of rejections), the machine keeps k at 1 or more until the test
  fires or the trials look healthy again. A suspicion that forces a window of trials without firing (acceptance
  hovering at the floor) lapses for another window, so it costs a bounded share of steps at k = 1.
- A gradual decline moves the baseline with it (the half-life is many windows long), so it never opens a gap of
  ``1 / ratio`` against it; a drop of that size within one window is a cliff by definition. A cliff in the traffic
  itself (every running request suddenly unpredictable) looks the same to any acceptance statistic; the action
  tells the two apart afterwards: a draft restored from its checkpoint that still accepts nothing was not the
  problem (see below).

**The machine.** ``healthy`` -> ``collapsed`` (k forced to 0, the reason kept) -> ``restoring`` (where the draft
can be rebuilt from its source) -> ``probing`` (k > 0 for a window of trials) -> ``healthy`` when the probe's
acceptance is back above the floor, else ``collapsed`` again, with a doubling backoff before the next probe. A
probe that fails with a draft known good (just restored from its checkpoint, or a method without weights, such as
n-gram lookup) counts against the traffic; after ``probes_until_workload`` such failures the machine concludes
the acceptance is the workload's: ``healthy`` with the baseline forgotten, and the policy decides k again. A draft
that could not be restored is never known good: it stays off, probed with the capped backoff, because a broken
draft under ``fixed`` k costs every step.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from enum import Enum


class CollapseState(Enum):
    """The machine's states: the telemetry's ``collapse_state``, the status COLLAPSE column and the
    ``specserve_acceptance_collapse_state`` metric's label."""

    HEALTHY = "healthy"
    # Acceptance fell off a cliff: k is forced to 0 until a probe.
    COLLAPSED = "collapsed"
    # The draft is being rebuilt from its checkpoint; k stays 0.
    RESTORING = "restoring"
    # k > 0 for a window of trials, to see whether acceptance is back.
    PROBING = "probing"


@dataclass(frozen=True, slots=True)
class CollapseParams:
    # The floor is this share of the baseline: a drop to a quarter of what the replica had is no workload drift.
    ratio: float = 0.25
    # First-position acceptance the baseline must reach to arm the detector: below it speculation barely pays,
    # and the policy, not this machine, handles it.
    min_baseline: float = 0.2
    # Trials the baseline must rest on before it is trusted (a few seconds of a busy replica).
    baseline_trials: float = 200.0
    # The baseline's memory: long against a window (tens of trials), so only a cliff opens a gap.
    half_life_trials: float = 2000.0
    # Binomial tail at which the window's acceptance is below the floor. Small: the detector tests every step.
    confidence: float = 1e-4
    # Binomial tail at which the window is suspect: k is kept at 1 or more until the test decides, so that a
    # policy that answered the same rejections with k = 0 does not starve the detector of its trials.
    suspect_confidence: float = 0.05
    # Seconds from a failed probe (or a collapse with nothing to restore) to the next probe; doubled per failure.
    backoff_s: float = 5.0
    max_backoff_s: float = 120.0
    # Failed probes with a draft known good after which the low acceptance is taken as the traffic's.
    probes_until_workload: int = 3


def binomial_tail(successes: int, trials: int, p: float) -> float:
    """``P(X <= successes)`` for ``X ~ Binomial(trials, p)``, summed term by term (successes are few when it
    matters; the terms are built in log space so that hundreds of trials do not underflow)."""
    if successes >= trials:
        return 1.0
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    total = 0.0
    for i in range(successes + 1):
        log_choose = math.lgamma(trials + 1) - math.lgamma(i + 1) - math.lgamma(trials - i + 1)
        total += math.exp(log_choose + i * log_p + (trials - i) * log_q)
    return min(1.0, total)


def trials_needed(floor: float, confidence: float) -> int:
    """Trials after which zero successes say, with ``confidence``, that acceptance is below ``floor``."""
    return math.ceil(math.log(confidence) / math.log1p(-floor))


def first_position_trials(drafted: tuple[int, ...], accepted: tuple[int, ...]) -> tuple[int, int]:
    """A step's trials and successes from its per-request drafted and accepted counts (``StepRecord``)."""
    trials = successes = 0
    for d, a in zip(drafted, accepted, strict=True):
        if d > 0:
            trials += 1
            successes += int(a > 0)
    return trials, successes


class AcceptanceCliff:
    """The detector: a window of the latest trials tested against a floor under the decayed baseline."""

    def __init__(self, params: CollapseParams = CollapseParams()) -> None:
        self.params = params
        self.window: deque[tuple[int, int]] = deque()  # per step: (trials, successes)
        self.times: deque[float] = deque()  # per step in the window: when it ran
        # The stretch of the latest steps that fired the test: (successes, trials).
        self.fired = (0, 0)
        self.window_trials = self.window_successes = 0
        # The decayed baseline: successes and trials, older than the window.
        self.base_successes = self.base_trials = 0.0
        # Suspect: the latest trials fall below the floor at ``suspect_confidence``, not yet at ``confidence``.
        self.suspect = False
        self.num_suspicions = 0
        # Trials a suspicion may still force before it lapses, and (after a lapse) trials before a new one.
        self._suspect_left = self._quiet_left = 0

    @property
    def baseline(self) -> float | None:
        """The established first-position acceptance; None until ``baseline_trials`` trials rest under it."""
        if self.base_trials < self.params.baseline_trials:
            return None
        return self.base_successes / self.base_trials

    @property
    def floor(self) -> float | None:
        """The acceptance a collapse is below; None while the detector is not armed."""
        baseline = self.baseline
        if baseline is None or baseline < self.params.min_baseline:
            return None
        return self.params.ratio * baseline

    @property
    def recent(self) -> float | None:
        return self.window_successes / self.window_trials if self.window_trials else None

    def window_size(self) -> int:
        """Trials the window keeps: at the floor the baseline arms it with, or at the lowest floor while unarmed."""
        p = self.params
        floor = self.floor or p.ratio * p.min_baseline
        return math.ceil(1.5 * trials_needed(floor, p.confidence))

    def observe(self, trials: int, successes: int, now_s: float = 0.0) -> bool:
        """Add a step's trials; True when the window's acceptance is below the floor with the set confidence."""
        if trials == 0:
            return False
        self.window.append((trials, successes))
        self.times.append(now_s)
        self.window_trials += trials
        self.window_successes += successes
        size = self.window_size()
        while self.window and self.window_trials - self.window[0][0] >= size:
            self._fold(*self.window.popleft())
            self.times.popleft()
        fired, lowest = self.below_floor()
        self._suspect(fired, lowest, trials)
        return fired

    def below_floor(self) -> tuple[bool, float]:
        """Whether the latest trials, over any stretch of whole steps back from the newest that holds enough of
        them, are below the floor with the set confidence: a cliff is seen once enough trials fell after it,
        not only once the good trials before it have left the window. Also the lowest tail over the stretches
        with enough trials for a suspicion (1.0 where none has)."""
        floor = self.floor
        if floor is None:
            return False, 1.0
        p = self.params
        needed = trials_needed(floor, p.confidence)
        suspect_needed = trials_needed(floor, p.suspect_confidence)
        lowest = 1.0
        trials = successes = 0
        for n, s in reversed(self.window):
            trials, successes = trials + n, successes + s
            # At or above the floor's mean the tail is near 1/2 or more: skip the sum (the usual healthy step).
            if trials < suspect_needed or successes >= floor * trials:
                continue
            tail = binomial_tail(successes, trials, floor)
            lowest = min(lowest, tail)
            if trials >= needed and tail <= p.confidence:
                self.fired = (successes, trials)
                return True, tail
        return False, lowest

    def _suspect(self, fired: bool, lowest: float, trials: int) -> None:
        """Start, keep or end a suspicion. It ends when the test fires, when the latest trials no longer look low,
        or, having forced a window's worth of trials without firing (acceptance hovering at the floor), by lapsing
        for another window's worth, so that it costs a bounded share of steps at k = 1."""
        low = lowest <= self.params.suspect_confidence
        if self.suspect:
            self._suspect_left -= trials
            if fired or not low:
                self.suspect = False
            elif self._suspect_left <= 0:
                self.suspect = False
                self._quiet_left = self.window_size()
        elif self._quiet_left > 0:
            self._quiet_left -= trials
        elif low and not fired:
            self.suspect = True
            self.num_suspicions += 1
            self._suspect_left = self.window_size()

    def _fold(self, trials: int, successes: int) -> None:
        self.window_trials -= trials
        self.window_successes -= successes
        decay = 0.5 ** (trials / self.params.half_life_trials)
        self.base_trials = self.base_trials * decay + trials
        self.base_successes = self.base_successes * decay + successes

    def clear_window(self) -> None:
        """Forget the window (its trials were the collapse's, or a probe's), keeping the baseline."""
        self.window.clear()
        self.times.clear()
        self.window_trials = self.window_successes = 0
        self.suspect = False
        self._suspect_left = self._quiet_left = 0

    def forget_baseline(self) -> None:
        self.clear_window()
        self.base_trials = self.base_successes = 0.0


@dataclass(frozen=True, slots=True)
class Transition:
    """One change of state and why, in words with the numbers behind it (the engine logs one line per
    transition and shows the latest as the telemetry's ``last_action``)."""

    now_s: float
    state: CollapseState
    reason: str


class CollapseMachine:
    """The states around the detector. ``can_restore``: whether the draft can be rebuilt from its source (and why
    not, ``restore_refusal``); ``has_weights``: false for drafters without weights (n-gram lookup), which are never
    restored and are known good."""

    def __init__(
        self,
        params: CollapseParams = CollapseParams(),
        restore_refusal: str = "",
        has_weights: bool = True,
    ) -> None:
        self.params = params
        self.detector = AcceptanceCliff(params)
        self.restore_refusal = restore_refusal
        self.has_weights = has_weights
        self.state = CollapseState.HEALTHY
        self.num_collapses = 0
        self.num_restores = 0
        self.num_failed_probes = 0
        self.last: Transition | None = None
        # The floor of the collapse under way (the baseline before it), which its probes must reach.
        self.floor = 0.0
        self.retry_at_s = 0.0
        # When the latest collapse's window began: the steps since then verified the broken draft's drafts.
        self.bad_since_s = 0.0
        self._backoff_s = params.backoff_s
        self._restored = False  # this collapse's draft was rebuilt from its source
        self._failed_good_probes = 0

    @property
    def draft_restored(self) -> bool:
        """Whether this collapse's draft has been rebuilt from its source."""
        return self._restored

    @property
    def can_restore(self) -> bool:
        return self.has_weights and not self.restore_refusal

    def wants_restore(self, now_s: float) -> bool:
        """The engine should rebuild the draft now (then call ``restoring``)."""
        return (
            self.state is CollapseState.COLLAPSED
            and self.can_restore
            and not self._restored
            and now_s >= self.retry_at_s
        )

    def forced_k(self, k: int) -> int:
        """The step's k once this machine has had its say: 0 while collapsed or restoring, at least 1 while probing
        (a policy that learned the collapse's acceptance would choose 0 and never see it come back) and while the
        detector is suspect (a policy that answered the first rejections with k = 0 would leave a broken draft
        undetected, and unrestored, for as long as its occasional probes take to add up to a test)."""
        if self.state in (CollapseState.COLLAPSED, CollapseState.RESTORING):
            return 0
        if self.state is CollapseState.PROBING or self.detector.suspect:
            return max(k, 1)
        return k

    def observe(self, now_s: float, trials: int, successes: int) -> Transition | None:
        if self.state is CollapseState.HEALTHY:
            if not self.detector.observe(trials, successes, now_s):
                return None
            d = self.detector
            # The window holds the whole cliff (it fires once enough trials fell after it, within the window).
            self.bad_since_s = d.times[0]
            self.floor = d.floor or 0.0
            self.num_collapses += 1
            self._restored = False
            self._failed_good_probes = 0
            self._backoff_s = self.params.backoff_s
            reason = (
                f"first-position acceptance {d.fired[0]}/{d.fired[1]} against a baseline of "
                f"{d.baseline:.2f} (floor {self.floor:.2f}): speculation off"
            )
            d.clear_window()
            if self.can_restore:
                self.retry_at_s = now_s
                return self._go(now_s, CollapseState.COLLAPSED, reason + "; restoring the draft from its source")
            self.retry_at_s = now_s + self._backoff_s
            why = self.restore_refusal or "the drafter has no weights to restore"
            return self._go(
                now_s, CollapseState.COLLAPSED, f"{reason}; not restored ({why}); probe in {self._backoff_s:.0f} s"
            )
        if self.state is CollapseState.PROBING:
            return self._probe(now_s, trials, successes)
        return None

    def _probe(self, now_s: float, trials: int, successes: int) -> Transition | None:
        d = self.detector
        if trials:
            d.window.append((trials, successes))
            d.window_trials += trials
            d.window_successes += successes
        needed = trials_needed(self.floor, self.params.confidence)
        seen, kept = d.window_trials, d.window_successes
        failed = seen >= needed and binomial_tail(kept, seen, self.floor) <= self.params.confidence
        if not failed and seen < math.ceil(1.5 * needed):
            return None
        d.clear_window()
        words = f"probe: {kept}/{seen} first drafts accepted (floor {self.floor:.2f})"
        if not failed and kept / seen >= self.floor:
            self._backoff_s = self.params.backoff_s
            return self._go(now_s, CollapseState.HEALTHY, f"{words}: speculation back on")
        self.num_failed_probes += 1
        known_good = self._restored or not self.has_weights
        if known_good:
            self._failed_good_probes += 1
            if self._failed_good_probes >= self.params.probes_until_workload:
                d.forget_baseline()
                return self._go(
                    now_s,
                    CollapseState.HEALTHY,
                    f"{words}, {self._failed_good_probes} times with "
                    + ("the draft restored from its source" if self._restored else "a drafter without weights")
                    + ": the traffic's acceptance, not a broken draft; baseline forgotten, the policy decides k",
                )
        self._backoff_s = min(2 * self._backoff_s, self.params.max_backoff_s)
        self.retry_at_s = now_s + self._backoff_s
        return self._go(
            now_s, CollapseState.COLLAPSED, f"{words}: speculation stays off, probe in {self._backoff_s:.0f} s"
        )

    def tick(self, now_s: float) -> Transition | None:
        """Between steps: a collapsed machine whose backoff has passed probes again (or restores first)."""
        restore_first = self.can_restore and not self._restored
        if self.state is CollapseState.COLLAPSED and not restore_first and now_s >= self.retry_at_s:
            self.detector.clear_window()
            return self._go(now_s, CollapseState.PROBING, "probing: k > 0 for a window of drafts")
        return None

    def restoring(self, now_s: float, how: str) -> Transition:
        return self._go(now_s, CollapseState.RESTORING, how)

    def restored(self, now_s: float, ok: bool, how: str) -> Transition:
        """The rebuild ended: probe at once, or (it failed) stay collapsed and try again after the backoff."""
        if ok:
            self._restored = True
            self.num_restores += 1
            self.detector.clear_window()
            return self._go(now_s, CollapseState.PROBING, f"{how}; probing")
        self.retry_at_s = now_s + self._backoff_s
        self._backoff_s = min(2 * self._backoff_s, self.params.max_backoff_s)
        return self._go(
            now_s, CollapseState.COLLAPSED, f"{how}; speculation stays off, retry in {self.retry_at_s - now_s:.0f} s"
        )

    def _go(self, now_s: float, state: CollapseState, reason: str) -> Transition:
        self.state = state
        self.last = Transition(now_s, state, reason)
        return self.last
