"""``sim reproduce``: one paper under --quick writes its report and plots; an unknown paper exits 2 naming it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from specserve.sim.cli import add_commands, run
from specserve.sim.reproduce import PAPERS, cap_k


def invoke(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_commands(parser)
    return run(parser.parse_args(list(argv)))


def test_reproduce_nightjar_quick_writes_report_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert invoke("reproduce", "--seed-paper", "nightjar", "--quick", "--out", str(tmp_path)) == 0
    report = (tmp_path / "nightjar.md").read_text()
    for run_ in PAPERS["nightjar"].runs:
        assert f"## {run_.scenario}" in report
        for spec in run_.policies:
            assert f"| `{spec}` |" in report
        assert (tmp_path / f"{run_.scenario}-throughput.png").stat().st_size > 0
        assert (tmp_path / f"{run_.scenario}-k.png").stat().st_size > 0  # piecewise rates: k over time is drawn
    assert "3734.23" in report  # the paper's Nightjar throughput, 7B ShareGPT (Table 5)
    printed = capsys.readouterr().out.split()
    assert str(tmp_path / "nightjar.md") in printed


def test_unknown_paper_exits_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert invoke("reproduce", "--seed-paper", "medusa", "--quick", "--out", str(tmp_path)) == 2
    assert "medusa" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_fixed_k_is_capped_by_max_k() -> None:
    assert cap_k("fixed:k=8", 4) == "fixed:k=4"
    assert cap_k("fixed:k=2", 4) == "fixed:k=2"
    assert cap_k("mlp:objective=tokens", 4) == "mlp:objective=tokens"


def test_adaspec_report_shows_slo_attainment(tmp_path: Path) -> None:
    """AdaSpec's scenario has a TPOT SLO, so its table gets the attainment column and a line naming the best."""
    assert invoke("reproduce", "--seed-paper", "adaspec", "--quick", "--out", str(tmp_path)) == 0
    report = (tmp_path / "adaspec.md").read_text()
    assert "| SLO att. |" in report and "Highest TPOT SLO attainment (" in report
