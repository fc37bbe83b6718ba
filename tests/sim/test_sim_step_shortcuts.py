"""The simulator's per-step shortcuts (issue 62) compute what the longer way did: the accepted prefix, a step start
taken without the heap, a step's draft passes priced once per distinct token count, and the confidence calibration's
counts over a large batch."""

from __future__ import annotations

import numpy as np
import pytest

from specserve.sim.events import EventQueue, Phase
from specserve.sim.latency import LinearForward, StepTimer
from specserve.sim.true_acceptance import accepted_prefix
from specserve.speculation import StepRecord
from specserve.speculation.estimators import confidence_calibration
from specserve.speculation.estimators.confidence_calibration import ConfidenceCalibration


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


def _calibration_record(rng: np.random.Generator, num_requests: int, width: int, ragged: bool) -> StepRecord:
    confidences = rng.random((num_requests, width))
    confidences[0, 0], confidences[-1, -1] = 1.0, 0.0  # the bins' edges
    drafted = rng.integers(1, width + 1, num_requests).tolist() if ragged else [width] * num_requests
    accepted = [int(rng.integers(0, d + 1)) for d in drafted]
    rows = tuple(tuple(row[:d]) for row, d in zip(confidences.tolist(), drafted, strict=True))
    return StepRecord(
        now_s=0.0,
        k=width,
        duration_s=0.01,
        num_running=num_requests,
        num_context_tokens=1,
        num_batched_tokens=num_requests,
        num_draft_passes=width,
        num_emitted_tokens=num_requests,
        num_drafted_per_request=tuple(drafted),
        num_accepted_per_request=tuple(accepted),
        draft_confidence_per_request=rows,
    )


def test_calibration_counts_a_large_batch_as_its_loop_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Large batches are counted with arrays (``_observe_table``); the sums equal the loop's to the last bit."""
    rng = np.random.default_rng(3)
    records = [
        _calibration_record(rng, int(rng.integers(2, 120)), int(rng.integers(1, 6)), ragged=bool(rng.random() < 0.3))
        for _ in range(200)
    ]
    tables, loops = ConfidenceCalibration(), ConfidenceCalibration()
    for record in records:
        tables.observe(record)
    monkeypatch.setattr(confidence_calibration, "VECTOR_MIN_REQUESTS", 10**9)
    for record in records:
        loops.observe(record)
    assert tables.table() == loops.table()
    assert tables.seen() == loops.seen() > 0
