"""`specserve doctor --prompts`: reading the prompts, and pricing what speculation pays on them from the measured steps
(the engine's side runs in tests/engine/test_startup_checks.py)."""

from __future__ import annotations

import pytest

from specserve.cluster.config import ConfigError
from specserve.cluster.doctor import acceptance_per_position, best_k_line, load_prompts, report
from specserve.replicas.serve.calibration import Calibration
from specserve.speculation.startup_checks import CheckCounts, Probe, ProbeResult, payoff_table

# (k, batch, decode step seconds): a draft pass costs 2 ms at batch 1 and 4 ms at batch 8.
COSTS = [(0, 1, 0.010), (1, 1, 0.012), (2, 1, 0.014), (0, 8, 0.020), (1, 8, 0.024), (2, 8, None)]


def test_a_k_pays_its_tokens_per_step_over_its_cost_against_k0_at_the_same_batch() -> None:
    rows = {(k, b): (tokens, speedup) for k, b, tokens, speedup in payoff_table(COSTS, [0.8, 0.5])}
    assert rows[(0, 1)] == (1.0, 1.0) and rows[(0, 8)] == (1.0, 1.0)
    # Draft 0 is kept with probability 0.8, draft 1 only after it: 0.8 x 0.5 (TurboSpec's Eq. 4, per position).
    assert rows[(1, 1)][0] == pytest.approx(1.8) and rows[(2, 1)][0] == pytest.approx(2.2)
    assert rows[(1, 1)][1] == pytest.approx(1.8 * 0.010 / 0.012)
    assert rows[(2, 1)][1] == pytest.approx(2.2 * 0.010 / 0.014)
    assert rows[(1, 8)][1] == pytest.approx(1.8 * 0.020 / 0.024)
    assert rows[(2, 8)] == (pytest.approx(2.2), None), "an untimed step prices nothing"


def test_the_best_k_per_batch_and_where_speculation_does_not_pay() -> None:
    payoff = payoff_table(COSTS, [0.8, 0.5])
    assert best_k_line(payoff) == "best k: batch 1: k = 2 (1.57 x), batch 8: k = 1 (1.50 x)"
    useless = payoff_table(COSTS, [0.05, 0.05])
    assert best_k_line(useless) == (
        "best k: batch 1: k = 0 (speculation does not pay), batch 8: k = 0 (speculation does not pay)"
    )


def test_the_report_reads_acceptance_as_accepted_over_reached_and_fills_a_position_no_draft_reached() -> None:
    acceptance = {"num_prompts": 3, "k": 3, "num_reached_per_pos": [40, 20, 0], "num_accepted_per_pos": [20, 15, 0]}
    assert acceptance_per_position(acceptance) == [0.5, 0.75, None]
    counts = CheckCounts(0, 0, 0, 0, 0, 0, 0, 0)
    timed = [ProbeResult(Probe(0, 1), counts, (0.010,)), ProbeResult(Probe(3, 1), counts, (0.013,))]
    lines = report(Calibration((), tuple(timed), "adaptive", 0.0), acceptance)
    assert "acceptance per draft position on 3 prompts at k = 3 (of the drafts that reached it): 0.500 0.750 -" in lines
    # Position 2, which no draft reached, is priced at position 1's rate: 1 + 0.5 + 0.5 x 0.75 + 0.5 x 0.75 x 0.75.
    header = lines.index("K  BATCH  TOKENS/STEP  SPEED-UP")
    assert lines[header + 2].split() == ["3", "1", "2.16", f"{2.15625 * 0.010 / 0.013:.2f}"]
    assert lines[-1] == f"best k: batch 1: k = 3 ({2.15625 * 0.010 / 0.013:.2f} x)"
    nothing = {**acceptance, "num_reached_per_pos": [0, 0, 0], "num_accepted_per_pos": [0, 0, 0]}
    assert report(Calibration((), tuple(timed), "adaptive", 0.0), nothing)[-1] == (
        "no draft reached position 0: nothing to price"
    )


def test_prompts_come_one_a_line_or_as_json_lines_and_bad_files_are_named(tmp_path) -> None:
    path = tmp_path / "prompts.txt"
    path.write_text('import os\n\n{"prompt": "def f():\\n    return"}\n   class A:\n')
    assert load_prompts(path) == ["import os", "def f():\n    return", "   class A:"]
    for text, message in (
        ("\n \n", "no prompts"),
        ('x\n{"text": "y"}\n', 'line 2: a JSON line needs a "prompt" string'),
        ("{not json\n", 'line 1: a JSON line needs a "prompt" string'),
    ):
        path.write_text(text)
        with pytest.raises(ConfigError, match=f"--prompts {path}: .*{message}"):
            load_prompts(path)
    with pytest.raises(ConfigError, match="cannot read it"):
        load_prompts(tmp_path / "missing.txt")
