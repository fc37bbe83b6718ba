"""The simulator's per-step shortcuts (issue 62) compute what the longer way did: the accepted prefix, a step start
taken without the heap, and a step's draft passes priced once per distinct token count."""

from __future__ import annotations

import numpy as np
import pytest

from specserve.sim.events import EventQueue, Phase
from specserve.sim.latency import LinearForward, StepTimer
from specserve.sim.true_acceptance import accepted_prefix


@pytest.mark.parametrize("shape", [(0, 3), (5, 0), (1, 1), (7, 4), (40, 6)])
def test_accepted_prefix_counts_the_leading_acceptances(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(sum(shape))
    for _ in range(20):
        passed = rng.random(shape) < rng.random()
        leading = [next((j for j, ok in enumerate(row) if not ok), len(row)) for row in passed.tolist()]
        got = accepted_prefix(passed)
        assert got.tolist() == leading
        assert got.dtype == np.int64


def test_first_after_says_whether_a_pushed_event_pops_next() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        queue = EventQueue()
        for _ in range(int(rng.integers(0, 4))):
            queue.push(float(rng.integers(0, 3)), Phase(int(rng.integers(0, len(Phase)))), replica=1)
        time_s, phase = float(rng.integers(0, 3)), Phase(int(rng.integers(0, len(Phase))))
        claimed = queue.first_after(time_s, phase)
        pushed = queue.push(time_s, phase, replica=2)
        assert claimed == (queue.pop() is pushed)


def test_draft_passes_priced_once_per_count_sum_as_priced_each() -> None:
    timer = StepTimer(LinearForward(1e-7, 3e-5, 4e-3), LinearForward(3e-8, 7e-6, 1.1e-3), 2e-4)
    for passes in ([], [64], [70, 9, 9, 9], [5, 9, 9, 5, 5], [3.5, 3.5]):
        _, draft_s, _ = timer.step_parts(1234, 77, passes)
        assert draft_s == float(sum(timer.draft.forward_s(1234, n) for n in passes))
