"""``lab/studies/step_costs/step_log_runs.py``: each run of a step log summarised, and with ``--phases`` split
by time."""

from __future__ import annotations

import random
import re
import subprocess
from pathlib import Path

from lab_scripts import run_script
from speculation_synthetic import make_record

from specserve.speculation import EngineTraits, StepContext, step_log

CPU_STEP = (5e-3, 1e-6, 5e-4, 1e-3, 1e-5)


def write_log(path: Path) -> list[list[int]]:
    """Two runs (fixed:k=1, then fixed:k=3) of 40 s each at one request, then four, then one; returns each run's
    emitted tokens in the first 10 s, the next 20 s and the rest."""
    rng = random.Random(0)
    lines, now, per_run = [], 0.0, []
    for k in (1, 3):
        start, tokens = now, [0, 0, 0]
        while now - start < 40.0:
            batch = 4 if 10.0 <= now - start < 30.0 else 1
            ctx = StepContext(now_s=now, num_running=batch, num_waiting=0, num_context_tokens=100)
            record = make_record(rng, CPU_STEP, now_s=now, k=k, num_running=batch, alpha=0.6, num_context_tokens=100)
            lines.append(step_log.encode("1", f"fixed:k={k}", EngineTraits(max_k=4), ctx, record))
            tokens[0 if now - start < 10.0 else 1 if now - start < 30.0 else 2] += record.num_emitted_tokens
            now += record.duration_s
        per_run.append(tokens)
    path.write_text("\n".join(lines) + "\n")
    return per_run


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_script("lab/studies/step_costs/step_log_runs.py", *args)


def test_phases_split_each_runs_tokens_and_batch_by_time(tmp_path: Path) -> None:
    log = tmp_path / "steps.jsonl"
    expected = write_log(log)
    done = run(str(log), "--phases", "10,20,15")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("  phases:")]
    assert len(lines) == 2
    for line, tokens in zip(lines, expected, strict=True):
        assert [int(t) for t in re.findall(r"(\d+)t ", line)] == tokens
        assert [float(b) for b in re.findall(r" b([\d.]+) ", line)] == [1.0, 4.0, 1.0]
    assert [float(k) for k in re.findall(r" k([\d.]+) b", lines[1])] == [3.0, 3.0, 3.0]


def test_bad_phases_are_a_cli_error_naming_them(tmp_path: Path) -> None:
    log = tmp_path / "steps.jsonl"
    write_log(log)
    for bad in ("30,x", "30,0"):
        done = run(str(log), "--phases", bad)
        assert done.returncode == 2
        assert f"--phases '{bad}'" in done.stderr
