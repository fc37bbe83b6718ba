"""lab/studies/oracle_gap/beside_oracle.py: a policy in control, the oracle pricing the same steps with the truth."""

from __future__ import annotations

import re

from lab_scripts import run_script

SCRIPT = "lab/studies/oracle_gap/beside_oracle.py"


def test_on_a_lookup_the_policys_step_seconds_are_the_truths_at_every_k() -> None:
    """The scenario's step times are linear, which the step-cost fit can learn exactly: every k's decode seconds
    must come out as the oracle prices them, a lookup's one search a step included (the oracle charged k passes
    before 2026-12-06, 7 % too much at k = 3)."""
    done = run_script(SCRIPT, "--scenario", "mixed-ngram-h100-8b", "--rate", "16", "--window", "8")
    assert done.returncode == 0, done.stderr
    rows = re.findall(r"^(\d)  ([\d.]+) \[[\d.]+, [\d.]+\]  ([\d.]+)$", done.stdout, re.MULTILINE)
    assert [int(k) for k, _, _ in rows] == list(range(9))  # max_k 8
    seconds = [float(s) for _, _, s in rows]
    assert all(abs(s - 1.0) < 0.02 for s in seconds), seconds


def test_a_policy_without_estimates_is_refused_by_name() -> None:
    done = run_script(SCRIPT, "--policy", "fixed:k=2", "--window", "2")
    assert done.returncode != 0 and "fixed:k=2" in done.stderr + done.stdout


def test_bad_arguments_are_the_parsers_errors() -> None:
    done = run_script(SCRIPT, "--rate", "0")
    assert done.returncode == 2 and "--rate: 0.0" in done.stderr
