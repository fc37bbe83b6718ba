"""``lab/studies/step_costs/k_slope.py``: a step-cost fit trained on one fixed-k run, beside what the fixed runs of
each k measured."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest
from lab_scripts import run_script
from speculation_synthetic import make_record

from specserve.speculation import EngineTraits, StepContext, step_log

TRAITS = EngineTraits(max_k=4)
CPU_STEP = (5e-3, 1e-6, 5e-4, 1e-3, 1e-5)


def fixed_log(path: Path, ks: list[int], steps_per_run: int = 240, timed: bool = False) -> dict[int, list[list[float]]]:
    """Fixed-k runs in turn, batches of 1-4; returns the durations of each run's batch-4 steps, per k. ``timed``:
    each step's parts timed, its draft a tenth of it and its target pass two thirds."""
    rng = random.Random(0)
    lines, now, at_four = [], 0.0, {}
    for k in ks:
        durations = []
        for step in range(steps_per_run):
            batch = 1 + step % 4
            ctx = StepContext(now_s=now, num_running=batch, num_waiting=0, num_context_tokens=100 + step)
            record = make_record(
                rng, CPU_STEP, now_s=now, k=k, num_running=batch, alpha=0.6, num_context_tokens=100 + step
            )
            record = dataclasses.replace(record, duration_s=record.duration_s * rng.uniform(0.9, 1.1))
            if timed:
                record = dataclasses.replace(
                    record, forward_s=record.duration_s * 2 / 3, draft_s=record.duration_s / 10
                )
            lines.append(step_log.encode("1", f"fixed:k={k}", TRAITS, ctx, record))
            if batch == 4:
                durations.append(record.duration_s)
            now += record.duration_s
        at_four.setdefault(k, []).append(durations)
    path.write_text("\n".join(lines) + "\n")
    return at_four


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_script("lab/studies/step_costs/k_slope.py", *args)


def test_it_reports_each_k_as_measured_and_as_each_fit_prices_it(tmp_path: Path) -> None:
    at_four = fixed_log(tmp_path / "steps.jsonl", [2, 3, 4, 2, 3, 4])
    out = run(str(tmp_path / "steps.jsonl"), "--batch", "4", "--json", str(tmp_path / "k.json"))
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "k.json").read_text())
    assert result["runs_per_k"] == {"2": 2, "3": 2, "4": 2}
    for k, runs in at_four.items():
        assert result["measured_s"][str(k)] == np.median([np.mean(r) for r in runs])
    for row in result["predicted_s_by_fit_k"].values():
        assert len(row) == 5 and all(a < b for a, b in zip(row, row[1:], strict=False))  # every further k costs more
    assert "measured per further k" in out.stdout


def test_a_log_with_one_fixed_k_is_refused_by_name(tmp_path: Path) -> None:
    fixed_log(tmp_path / "steps.jsonl", [3, 3])
    out = run(str(tmp_path / "steps.jsonl"))
    assert out.returncode == 2
    assert "fixed runs of 1 k" in out.stderr
    out = run(str(tmp_path / "steps.jsonl"), "--batch", "0")
    assert out.returncode == 2 and "--batch 0" in out.stderr


def test_a_log_with_timed_parts_reports_them_and_both_fits(tmp_path: Path) -> None:
    at_four = fixed_log(tmp_path / "steps.jsonl", [2, 3, 2, 3], timed=True)
    out = run(str(tmp_path / "steps.jsonl"), "--batch", "4", "--json", str(tmp_path / "k.json"))
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "k.json").read_text())
    assert result["parts_timed"] is True
    assert set(result["predicted_whole_s_by_fit_k"]) == set(result["predicted_s_by_fit_k"]) == {"2", "3"}
    for k in at_four:
        forward_s, draft_s, rest_s = result["measured_parts_s"][str(k)]
        whole_s = forward_s + draft_s + rest_s
        assert forward_s == pytest.approx(whole_s * 2 / 3) and draft_s == pytest.approx(whole_s / 10)
    assert "timed parts" in out.stdout and "whole steps" in out.stdout
