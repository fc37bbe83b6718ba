"""The acceptance-collapse detector and its state machine (``speculation/collapse.py``), on synthetic trials: it
fires on a cliff from an established baseline and on nothing else, and the machine walks collapse, restore, probe."""

from __future__ import annotations

import copy
import math
import random

import pytest

from specserve.speculation.collapse import (
    AcceptanceCliff,
    CollapseMachine,
    CollapseParams,
    CollapseState,
    Transition,
    binomial_tail,
    first_position_trials,
    trials_needed,
)

REQUESTS = 8  # trials per step: one per request that verified a draft


def steps(rng: random.Random, rate: float, n: int, requests: int = REQUESTS):
    for _ in range(n):
        yield requests, sum(rng.random() < rate for _ in range(requests))


def fires_at(detector: AcceptanceCliff, trials) -> int | None:
    """The index of the step the detector fires on, or None."""
    for i, (n, s) in enumerate(trials):
        if detector.observe(n, s):
            return i
    return None


def test_the_binomial_tail_matches_the_direct_sum():
    # P(X <= 1) for Binomial(10, 0.3): 0.7^10 + 10 * 0.3 * 0.7^9.
    assert binomial_tail(1, 10, 0.3) == pytest.approx(0.7**10 + 10 * 0.3 * 0.7**9)
    assert binomial_tail(10, 10, 0.3) == 1.0
    assert binomial_tail(0, 500, 0.2) == pytest.approx(0.8**500, rel=1e-6)  # no underflow to a wrong value


def test_a_step_counts_one_trial_per_request_that_verified_a_draft():
    assert first_position_trials((4, 4, 0, 2), (0, 3, 0, 1)) == (3, 2)


def test_a_cliff_from_an_established_baseline_fires_within_a_window():
    rng = random.Random(1)
    detector = AcceptanceCliff()
    assert fires_at(detector, steps(rng, 0.75, 200)) is None
    baseline = detector.baseline
    assert baseline is not None and abs(baseline - 0.75) < 0.05
    at = fires_at(detector, steps(rng, 0.0, 200))
    # Zero successes are significant after trials_needed trials at the floor: it fires on the step that brings them,
    # whatever good trials from before the cliff are still in the window.
    needed = trials_needed(detector.params.ratio * baseline, detector.params.confidence)
    assert at is not None and needed / REQUESTS - 1 <= at <= needed / REQUESTS + 1


def test_a_partial_cliff_to_near_zero_fires_too():
    rng = random.Random(2)
    detector = AcceptanceCliff()
    fires_at(detector, steps(rng, 0.7, 200))
    assert fires_at(detector, steps(rng, 0.03, 200)) is not None


def test_a_draft_poor_from_the_start_never_arms_the_detector():
    rng = random.Random(3)
    detector = AcceptanceCliff()
    assert fires_at(detector, steps(rng, 0.1, 3000)) is None
    assert detector.floor is None and detector.baseline is not None
    assert fires_at(detector, steps(rng, 0.0, 500)) is None


def test_a_gradual_decline_moves_the_baseline_with_it():
    rng = random.Random(4)
    detector = AcceptanceCliff()
    # From 0.8 to 0.05 over 60 000 trials: the traffic drifts, the draft is fine.
    total = 7500
    for i in range(total):
        rate = 0.8 - 0.75 * i / total
        ((n, s),) = steps(rng, rate, 1)
        assert not detector.observe(n, s), f"fired at step {i}, acceptance {rate:.2f}"
    assert detector.floor is None, "the baseline followed the decline below the arming level"


def test_a_healthy_replica_with_noisy_batches_never_fires():
    rng = random.Random(5)
    detector = AcceptanceCliff()
    # Batches of 1 to 8 requests at a modest acceptance, for a long time.
    for _ in range(20000):
        n = rng.randint(1, 8)
        assert not detector.observe(n, sum(rng.random() < 0.35 for _ in range(n)))
    assert detector.floor is not None, "armed all along"


def test_steps_without_drafts_change_nothing():
    """Under adaptive a low-acceptance workload drives k to 0: no trial, no test."""
    detector = AcceptanceCliff()
    fires_at(detector, steps(random.Random(6), 0.8, 100))
    before = (detector.window_trials, detector.base_trials)
    for _ in range(1000):
        assert not detector.observe(0, 0)
    assert (detector.window_trials, detector.base_trials) == before


def last(machine: CollapseMachine) -> Transition:
    assert machine.last is not None
    return machine.last


def moved(transition: Transition | None) -> Transition:
    assert transition is not None
    return transition


def collapse(machine: CollapseMachine, rng: random.Random, now: float = 100.0) -> None:
    for n, s in steps(rng, 0.8, 200):
        assert machine.observe(now, n, s) is None
    for n, s in steps(rng, 0.0, 100):
        if machine.observe(now, n, s) is not None:
            return
    raise AssertionError("no collapse")


def probe(machine: CollapseMachine, rng: random.Random, rate: float, now: float):
    assert machine.state is CollapseState.PROBING and machine.forced_k(0) >= 1
    for n, s in steps(rng, rate, 100):
        transition = machine.observe(now, n, s)
        if transition is not None:
            return transition
    raise AssertionError("the probe never ended")


def test_collapse_restore_probe_and_back():
    rng = random.Random(7)
    machine = CollapseMachine()
    assert machine.forced_k(4) == 4
    collapse(machine, rng)
    assert machine.state is CollapseState.COLLAPSED and machine.forced_k(4) == 0
    assert machine.num_collapses == 1 and "baseline of 0.8" in last(machine).reason
    # The reason counts the stretch that fired, not the older good trials still in the window.
    assert "first-position acceptance 0/" in last(machine).reason
    assert machine.wants_restore(100.0)
    machine.restoring(100.0, "rebuilding")
    assert machine.forced_k(4) == 0 and not machine.wants_restore(100.0)
    machine.restored(101.0, ok=True, how="rebuilt")
    assert machine.forced_k(4) == 4 and machine.forced_k(0) == 1
    back = probe(machine, rng, 0.8, 102.0)
    assert back.state is CollapseState.HEALTHY and "back on" in back.reason
    assert (machine.num_restores, machine.num_failed_probes) == (1, 0)
    # The baseline survived: a second collapse is detected as the first was.
    collapse(machine, rng, now=200.0)
    assert machine.num_collapses == 2 and machine.wants_restore(200.0)


def test_a_failed_restore_retries_after_the_backoff():
    rng = random.Random(8)
    params = CollapseParams(backoff_s=5.0)
    machine = CollapseMachine(params)
    collapse(machine, rng)
    machine.restoring(100.0, "rebuilding")
    machine.restored(101.0, ok=False, how="checkpoint missing")
    assert machine.state is CollapseState.COLLAPSED and machine.forced_k(4) == 0
    assert not machine.wants_restore(105.0) and machine.wants_restore(106.0)
    assert machine.tick(1000.0) is None, "a restorable draft is restored before it is probed"


def test_acceptance_still_low_with_the_draft_restored_is_the_traffics():
    rng = random.Random(9)
    params = CollapseParams(backoff_s=5.0, probes_until_workload=3)
    machine = CollapseMachine(params)
    collapse(machine, rng)
    machine.restoring(100.0, "rebuilding")
    machine.restored(101.0, ok=True, how="rebuilt")
    now, waits = 101.0, []
    for attempt in range(3):
        result = probe(machine, rng, 0.01, now)
        if attempt < 2:
            assert result.state is CollapseState.COLLAPSED and machine.forced_k(4) == 0
            waits.append(machine.retry_at_s - now)
            assert machine.tick(machine.retry_at_s - 0.1) is None
            now = machine.retry_at_s
            assert moved(machine.tick(now)).state is CollapseState.PROBING
    assert waits == [10.0, 20.0], "the backoff doubles per failed probe"
    assert result.state is CollapseState.HEALTHY and "the traffic's acceptance" in result.reason
    assert machine.detector.baseline is None, "the baseline is forgotten: it must be established again"
    assert machine.num_restores == 1 and machine.num_failed_probes == 3


def test_a_draft_that_cannot_be_restored_is_only_turned_off_and_probed():
    rng = random.Random(10)
    machine = CollapseMachine(CollapseParams(backoff_s=5.0), restore_refusal="elastic draft memory runs on CPU only")
    collapse(machine, rng)
    assert machine.state is CollapseState.COLLAPSED and not machine.wants_restore(1e9)
    assert "not restored (elastic draft memory runs on CPU only)" in last(machine).reason
    assert machine.tick(104.0) is None and moved(machine.tick(105.0)).state is CollapseState.PROBING
    # Its weights may be the broken ones, so it is never taken for the traffic: it stays off, probed.
    waits = []
    for _ in range(6):
        failed = probe(machine, rng, 0.0, machine.retry_at_s)
        assert failed.state is CollapseState.COLLAPSED
        waits.append(machine.retry_at_s - failed.now_s)
        machine.tick(machine.retry_at_s)
    assert waits == [10.0, 20.0, 40.0, 80.0, 120.0, 120.0], "doubling, capped"


def test_a_drafter_without_weights_never_restores_and_hands_back_after_its_probes():
    rng = random.Random(11)
    machine = CollapseMachine(CollapseParams(backoff_s=1.0, probes_until_workload=2), has_weights=False)
    collapse(machine, rng)
    assert not machine.wants_restore(1e9) and "no weights to restore" in last(machine).reason
    machine.tick(machine.retry_at_s)
    assert probe(machine, rng, 0.0, machine.retry_at_s).state is CollapseState.COLLAPSED
    machine.tick(machine.retry_at_s)
    assert probe(machine, rng, 0.0, machine.retry_at_s).state is CollapseState.HEALTHY


def policy_at_k0(machine: CollapseMachine, rate: float, probe_every: int, rng: random.Random, steps_max: int):
    """A policy that answers rejections with k = 0 and probes at k = 1 every ``probe_every`` steps (``adaptive``'s
    way), under the machine's forced k. Yields, per step, the k the step ran and whether it was a probe."""
    for i in range(steps_max):
        probe = i % probe_every == 0
        k = machine.forced_k(1 if probe else 0)
        trials = REQUESTS if k else 0
        machine.observe(float(i), trials, sum(rng.random() < rate for _ in range(trials)))
        yield k, probe


def test_a_policy_at_k0_does_not_starve_the_detector():
    rng = random.Random(12)
    machine = CollapseMachine()
    for n, s in steps(rng, 0.8, 200):
        machine.observe(0.0, n, s)
    floor = machine.detector.floor
    assert floor is not None
    p = machine.params
    probes = forced = 0
    for k, probe in policy_at_k0(machine, 0.0, 50, rng, 5000):
        probes += probe
        forced += k > 0 and not probe
        if machine.state is not CollapseState.HEALTHY:
            break
    assert machine.num_collapses == 1
    # The probes bring the suspicion, the forced steps the rest of the test's trials; on the probes alone the test
    # would wait for trials_needed of them.
    assert probes == math.ceil(trials_needed(floor, p.suspect_confidence) / REQUESTS)
    assert forced == math.ceil(trials_needed(floor, p.confidence) / REQUESTS) - probes
    assert probes < math.ceil(trials_needed(floor, p.confidence) / REQUESTS)


def test_a_suspicion_ends_when_the_drafts_are_accepted_again():
    rng = random.Random(13)
    detector = AcceptanceCliff()
    fires_at(detector, steps(rng, 0.8, 200))
    assert detector.floor is not None
    for n, s in steps(rng, 0.0, 3):
        assert not detector.observe(n, s)
    assert detector.suspect and detector.num_suspicions == 1
    for n, s in steps(rng, 0.8, 3):
        assert not detector.observe(n, s)
    assert not detector.suspect and detector.num_suspicions == 1


def test_a_suspicion_that_never_decides_lapses_and_forces_at_most_half_the_trials():
    rng = random.Random(14)
    detector = AcceptanceCliff()
    fires_at(detector, steps(rng, 0.8, 200))
    window = detector.window_size()
    # The worst case for the cost: each step brings the fewest successes that do not fire the test, so the latest
    # trials stay suspect without ever deciding (and drag the baseline, and with it the window, along).
    suspect_steps = run = 0
    smallest = window = detector.window_size()
    for _ in range(400):
        successes = next(s for s in range(REQUESTS + 1) if not copy.deepcopy(detector).observe(REQUESTS, s))
        assert not detector.observe(REQUESTS, successes)
        if detector.suspect and not run:
            window = detector.window_size()
            smallest = min(smallest, window)
        run = run + 1 if detector.suspect else 0
        suspect_steps += detector.suspect
        assert run * REQUESTS < window + REQUESTS, "a suspicion forced more than a window of trials"
    assert detector.num_suspicions > 1, "never suspected again after a lapse"
    # A window suspect (and a step), then a window quiet.
    assert suspect_steps / 400 <= (smallest + REQUESTS) / (2 * smallest + REQUESTS)
