"""lab/studies/startup_calibration/cold_clients.py, run as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

from lab_scripts import run_script

SCRIPT = "lab/studies/startup_calibration/cold_clients.py"


def test_it_writes_each_case_with_every_arm_against_the_best_fixed_k(tmp_path: Path) -> None:
    prefix = tmp_path / "calibration"
    done = run_script(SCRIPT, "--clients", "4", "--out", str(prefix))
    assert done.returncode == 0, done.stderr
    rows = json.loads(prefix.with_suffix(".json").read_text())["rows"]
    assert [(r["clients"], r["drafts_ahead"]) for r in rows] == [(4, True), (4, False)]
    for row in rows:
        assert row["best_fixed"] == max(row["fixed"].values())
        assert set(row["ratio"]) == {"cold", "calibrated to 8", "calibrated to max_num_seqs"}
    assert prefix.with_suffix(".png").stat().st_size > 0
    assert "| 4 | yes |" in prefix.with_suffix(".md").read_text()


def test_a_bad_client_list_is_refused_naming_it(tmp_path: Path) -> None:
    done = run_script(SCRIPT, "--clients", "64,many", "--out", str(tmp_path / "x"))
    assert done.returncode == 2 and "--clients" in done.stderr and "64,many" in done.stderr
