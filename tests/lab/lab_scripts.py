"""Running a lab script as users do, in a fresh interpreter with only the repository on its path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_script(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``script``: a path from the repository root, e.g. ``lab/studies/step_costs/k_slope.py``."""
    return subprocess.run(
        [sys.executable, str(ROOT / script), *args],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT)},
        check=False,
    )


def lab_cli(*args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    """``python -m lab ARGS`` from the repository root (the command users type), stdout and stderr apart. The
    timeout only stops a hung run: a leaderboard takes a minute on a busy 2-core machine."""
    return subprocess.run(
        [sys.executable, "-m", "lab", *args], capture_output=True, text=True, timeout=timeout_s, cwd=ROOT, check=False
    )
