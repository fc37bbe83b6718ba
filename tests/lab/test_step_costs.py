"""What each k and each change of k cost, read from a step log (``experiments.step_costs``)."""

from __future__ import annotations

import pytest

from lab.experiments.step_costs import decode_cells, format_report, switch_excess
from specserve.speculation import EngineTraits, StepContext, StepRecord
from specserve.speculation.step_log import LoggedStep

TRAITS = EngineTraits(max_k=4, k0_runs_draft_pass=False)
BATCH = 2
STEADY_S = {0: 0.030, 2: 0.040, 3: 0.050}
# What the engine adds to the first and second step at a new k.
FIRST_EXTRA_S, SECOND_EXTRA_S = 0.010, 0.004


def logged(policy: str, k: int, duration_s: float, catch_up: int = 0) -> LoggedStep:
    ctx = StepContext(now_s=0.0, num_running=BATCH, num_waiting=0, num_context_tokens=100)
    record = StepRecord(
        now_s=0.0,
        k=k,
        duration_s=duration_s,
        num_running=BATCH,
        num_context_tokens=100,
        num_batched_tokens=BATCH * (k + 1) + catch_up,
        num_draft_passes=k,
        num_emitted_tokens=BATCH * (1 + k // 2),
    )
    return LoggedStep("1", policy, TRAITS, ctx, record)


def segments(policy: str, ks: list[int], length: int = 20) -> list[LoggedStep]:
    """``length`` steps at each k in turn; the two steps after each change cost extra, and a resume's first
    step also catches the draft up (more tokens than its decode rows)."""
    steps: list[LoggedStep] = []
    previous = None
    for k in ks:
        for i in range(length):
            extra = (FIRST_EXTRA_S if i == 0 else SECOND_EXTRA_S if i == 1 else 0.0) if previous is not None else 0.0
            catch_up = 40 if previous == 0 and i == 0 else 0
            steps.append(logged(policy, k, STEADY_S[k] + extra, catch_up))
        previous = k
    return steps


def test_decode_cells_report_each_batch_and_k_of_every_run() -> None:
    steps = segments("fixed:k=2", [2]) + segments("adaptive", [2, 3, 2, 0, 2])
    cells = {(c.num_running, c.k): c for c in decode_cells(steps)}
    assert set(cells) == {(BATCH, 0), (BATCH, 2), (BATCH, 3)}
    assert cells[(BATCH, 2)].median_s == pytest.approx(STEADY_S[2])
    assert cells[(BATCH, 2)].steps == 20 + 3 * 20 - 1  # the resume's catch-up step is not a decode step
    assert cells[(BATCH, 3)].median_tokens_per_s == pytest.approx(BATCH * 2 / STEADY_S[3])
    assert [c.k for c in decode_cells(steps, policy="fixed")] == [2]
    assert decode_cells(steps, min_steps=21) == [c for c in decode_cells(steps) if c.steps >= 21]


def test_a_switchs_steps_are_measured_against_steady_steps_of_their_own_shape() -> None:
    steps = segments("fixed:k=2", [2]) + segments("adaptive", [2, 3, 2, 0, 2])
    excess = {(s.kind, s.position): s for s in switch_excess(steps, "adaptive")}
    move_first = sorted([FIRST_EXTRA_S / STEADY_S[3], FIRST_EXTRA_S / STEADY_S[2]])
    assert excess[("move", 1)].steps == 2
    assert excess[("move", 1)].mean == pytest.approx(sum(move_first) / 2)
    assert excess[("move", 2)].median == pytest.approx(
        (SECOND_EXTRA_S / STEADY_S[3] + SECOND_EXTRA_S / STEADY_S[2]) / 2
    )
    assert excess[("stop", 1)].median == pytest.approx(FIRST_EXTRA_S / STEADY_S[0])
    # A resume's first step is a catch-up, not a decode step: only its second step is measured.
    assert ("resume", 1) not in excess
    assert excess[("resume", 2)].median == pytest.approx(SECOND_EXTRA_S / STEADY_S[2])
    # The steps before each change ran steady: no excess there, so the switch, not the machine, cost the rest.
    assert excess[("move", -1)].median == pytest.approx(0.0)
    assert excess[("stop", -1)].steps == 1
    # The fixed run has no switch, and steady steps alone show no excess.
    assert switch_excess(steps, "fixed") == []
    report = format_report(decode_cells(steps), switch_excess(steps))
    assert "| stop | 1 | 1 |" in report and f"| {BATCH} | 3 | 20 |" in report
