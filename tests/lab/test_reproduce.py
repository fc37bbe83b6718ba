"""``sim reproduce``: one paper under --quick writes its report and plots; an unknown paper exits 2 naming it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from lab.experiments.cli import add_commands, run
from lab.experiments.dsde_sweep import sweep_summary
from lab.experiments.papers import Paper, PaperDataError, load_yaml
from lab.experiments.reproduce import PAPERS, SUMMARIES, cap_k
from specserve.sim import builtin_scenarios


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


def _row(e2e_s: float, p99_s: float = 1.0, tpot_s: float = 0.01, tok_s: float = 100.0) -> dict:
    return {"mean_e2e_s": e2e_s, "p99_e2e_s": p99_s, "mean_tpot_s": tpot_s, "throughput_tok_s": tok_s}


def test_dsde_sweep_summary_worked_example() -> None:
    """Static-opt is the best fixed k per batch cap (the paper's per-dataset profiling); the Fig. 9 ratio is batch-64
    over batch-1 throughput. Batch 1: AR 40 s, best fixed k=4 at 16 s (2.50x), kld 16.4 s (2.44x, 2.5% slower).
    Batch 64: the cap halves p99 (10 -> 5 s) and kld scales 800 / 100 = 8x against 600 / 100 = 6x uncapped (+33.3%)."""
    fixed = {f"fixed:k={k}": _row(e2e) for k, e2e in zip((2, 4, 6, 8, 10), (20.0, 16.0, 17.0, 18.0, 19.0), strict=True)}
    batch1 = {"fixed:k=0": _row(40.0), **fixed, "kld": _row(16.4), "kld:cap=false": _row(16.4)}
    batch64 = {
        "fixed:k=0": _row(8.0),
        **{spec: _row(6.0) for spec in fixed},
        "fixed:k=2": _row(4.0),
        "kld": _row(5.0, p99_s=5.0, tok_s=800.0),
        "kld:cap=false": _row(6.4, p99_s=10.0, tok_s=600.0),
    }
    text = "\n".join(sweep_summary({"dsde-a100x8-70b-bs64": batch64, "dsde-a100x8-70b-bs1": batch1}))
    assert "| 1 | 40.0 | `fixed:k=4` | 2.50x | 2.44x | 2.5% slower | 2.44x |" in text
    assert "| 64 | 8.0 | `fixed:k=2` | 2.00x | 1.60x | 25.0% slower | 1.25x | 5.0 / 10.0 |" in text
    assert "p99 end-to-end latency by -50.0%" in text
    assert "`kld` 8.00x, `kld:cap=false` 6.00x, so the cap adds +33.3% at batch 64" in text


def test_dsde_sweeps_batch_caps_1_to_64() -> None:
    """Table III's "varying batch sizes" and Fig. 9's 1 -> 64: one run per batch cap, the cap ablation in each."""
    dsde = PAPERS["dsde"]
    assert [run.scenario for run in dsde.runs] == [f"dsde-a100x8-70b-bs{b}" for b in (1, 8, 32, 64)]
    assert all({"fixed:k=0", "kld", "kld:cap=false"} <= set(run.policies) for run in dsde.runs)
    assert SUMMARIES[dsde.summary] is sweep_summary


def test_paper_files_name_builtin_scenarios_and_cite_every_number() -> None:
    for paper in PAPERS.values():
        assert paper.reference and paper.runs
        for paper_run in paper.runs:
            assert paper_run.scenario in builtin_scenarios()
            numbers = [ref.metric or ref.speedup for ref in paper_run.refs.values()]
            assert all(number.cite for number in numbers if number is not None)
    assert all(number.cite for paper in PAPERS.values() for number in paper.numbers.values())


def test_paper_speedups_come_from_the_cited_numbers() -> None:
    """TurboSpec Table 4: Org's mean latency over QPS 1/4/8/16 over TS's; AdaSpec prints its speedup itself."""
    turbospec = PAPERS["turbospec"]
    sweep = turbospec.runs[0]
    org, ts = (2.63 + 3.39 + 4.86 + 13.73) / 4, (1.34 + 1.90 + 2.98 + 13.62) / 4
    assert turbospec.paper_speedup(sweep, "goodput") == pytest.approx(org / ts)
    assert turbospec.paper_speedup(sweep, "fixed:k=0") == 1.0 and turbospec.paper_speedup(sweep, "fixed:k=2") is None
    adaspec = PAPERS["adaspec"]
    assert adaspec.paper_speedup(adaspec.runs[0], "slo") == 1.73


def test_a_bad_paper_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: bad\ntitle: Bad\nreference: r\nmetric: mean_e2e_s\nhigher_is_better: false\n"
        "baseline: fixed:k=0\npaper_metric_higher_is_better: false\n"
        "runs: [{scenario: s, policies: [fixed:k=1], not_comparable: n, shape: s}]\n"
    )
    with pytest.raises(PaperDataError, match="bad.yaml: .*run 's': baseline 'fixed:k=0'"):
        load_yaml(bad, Paper)
