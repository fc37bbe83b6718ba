"""ConfidenceCalibration: what a draft's confidence has meant, learned from the verifier's verdicts."""

from __future__ import annotations

import random

import pytest

from specserve.speculation.estimators.confidence_calibration import ConfidenceCalibration, calibrated
from specserve.speculation.types import StepRecord


def record(accepted: list[int], confidences: list[list[float]]) -> StepRecord:
    return StepRecord(
        now_s=0.0,
        k=4,
        duration_s=0.01,
        num_running=len(accepted),
        num_context_tokens=0,
        num_batched_tokens=5 * len(accepted),
        num_draft_passes=4,
        num_emitted_tokens=sum(accepted) + len(accepted),
        num_drafted_per_request=tuple(len(c) for c in confidences),
        num_accepted_per_request=tuple(accepted),
        draft_confidence_per_request=tuple(tuple(c) for c in confidences),
    )


def test_an_underconfident_draft_is_read_at_the_acceptance_it_has() -> None:
    # A draft that says 0.05 and is right 70 % of the time, and says 0.55 and is always right.
    rng = random.Random(0)
    calibration = ConfidenceCalibration(num_bins=10)
    for _ in range(300):
        accepted, confidences = [], []
        for _ in range(4):
            drafts = [rng.choice((0.05, 0.55)) for _ in range(4)]
            n = 0
            while n < 4 and rng.random() < (0.7 if drafts[n] < 0.1 else 1.0):
                n += 1
            accepted.append(n)
            confidences.append(drafts)
        calibration.observe(record(accepted, confidences))
    assert calibration.acceptance(0.05) == pytest.approx(0.7, abs=0.05)
    assert calibration.acceptance(0.55) == pytest.approx(1.0, abs=0.02)
    # A bin with nothing seen reads as the draft says.
    assert calibration.acceptance(0.95) == pytest.approx(0.95)
    assert calibrated(None, [0.05]) == [0.05]
    assert calibrated(calibration, [0.05])[0] > 0.6


def test_only_drafts_that_reached_verification_count() -> None:
    calibration = ConfidenceCalibration(num_bins=10, prior_weight=0.0)
    # Accepted 1: position 0 accepted, position 1 rejected, positions 2-3 never judged.
    calibration.observe(record([1], [[0.95, 0.15, 0.25, 0.35]]))
    table = {round(edge, 1): (seen, acceptance) for edge, seen, acceptance in calibration.table() if seen}
    assert table == {0.9: (1.0, 1.0), 0.1: (1.0, 0.0)}


def test_old_evidence_is_forgotten() -> None:
    calibration = ConfidenceCalibration(num_bins=1, half_life_steps=10, prior_weight=0.0)
    for _ in range(100):
        calibration.observe(record([0], [[0.5]]))
    for _ in range(50):
        calibration.observe(record([1], [[0.5]]))
    assert calibration.acceptance(0.5) > 0.95


def test_bad_settings_are_refused_by_name() -> None:
    for kwargs, name in (({"num_bins": 0}, "num_bins"), ({"half_life_steps": 0}, "half_life_steps")):
        with pytest.raises(ValueError, match=name):
            ConfidenceCalibration(**kwargs)
