"""The leaderboard: static cells per distinct rate, the three verdicts, the report and the CLI's errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from sim_helpers import small_scenario

from specserve.experiments.leaderboard import Cell, at_static_rate, evaluate, is_dynamic, rivals, static_rates
from specserve.experiments.leaderboard_report import write_report
from specserve.sim.runner import run_scenario
from specserve.sim.scenario import load_scenario


def two_rate_file(tmp_path):
    scenario = small_scenario(
        workload={
            "arrivals": {
                "kind": "piecewise",
                "segments": [
                    {"duration_s": 4, "rate_qps": 2},
                    {"duration_s": 4, "rate_qps": 8},
                    {"duration_s": 4, "rate_qps": 2},
                ],
            }
        }
    )
    path = tmp_path / "two-rates.yaml"
    path.write_text(yaml.safe_dump(scenario.model_dump(mode="json", exclude={"name"}, exclude_none=True)))
    return path


def test_static_rates_and_cells() -> None:
    scenario = small_scenario(
        workload={
            "arrivals": {
                "kind": "piecewise",
                "segments": [
                    {"duration_s": 4, "rate_qps": 2},
                    {"duration_s": 4, "rate_qps": 0},
                    {"duration_s": 4, "rate_qps": 8},
                ],
            }
        }
    )
    assert is_dynamic(scenario) and static_rates(scenario) == [2, 8]
    steady = at_static_rate(scenario, 8, 30.0)
    assert not is_dynamic(steady)
    assert (steady.workload.arrivals.rate_qps, steady.workload.arrivals.duration_s) == (8, 30.0)
    poisson = small_scenario()
    assert not is_dynamic(poisson) and at_static_rate(poisson, 8, 30.0) is poisson
    assert "fixed:k=6" not in rivals("adaptive", 4) and "adaptive" not in rivals("adaptive", 8)
    assert "bandit" in rivals("adaptive", 4) and "fixed:k=8" in rivals("goodput", 8)


def test_cell_ratio_is_against_the_best_rival() -> None:
    cell = Cell(
        "s", None, {"a": {"throughput_tok_s": 99.0}, "b": {"throughput_tok_s": 100.0}, "c": {"throughput_tok_s": 50.0}}
    )
    assert cell.best_rival("a") == "b" and cell.ratio("a") == pytest.approx(0.99)
    assert cell.best_rival("b") == "a" and cell.ratio("b") == pytest.approx(100 / 99)


def test_evaluate_and_report(tmp_path) -> None:
    board = evaluate("adaptive", [str(two_rate_file(tmp_path))], seeds=(0,), static_window_s=6.0, workers=2)
    assert [cell.rate_qps for cell in board.static] == [2, 8]
    assert len(board.dynamic) == 1 and set(board.dynamic[0].results) == {"adaptive", *rivals("adaptive", 4)}
    means = board.dynamic_means()
    # One dynamic scenario: each policy's mean is its throughput over that scenario's best, so the best scores 1,
    # the list runs best first, and dynamic_pass says whether the policy under test is that best.
    cell = board.dynamic[0]
    best = max(cell.results, key=lambda spec: cell.results[spec]["throughput_tok_s"])
    assert next(iter(means)) == best and means[best] == pytest.approx(1.0)
    assert list(means.values()) == sorted(means.values(), reverse=True) and all(0 < v <= 1 for v in means.values())
    assert board.dynamic_pass() == (best == "adaptive")
    assert board.switches()[0][0] == "two-rates"
    written = write_report(board, tmp_path / "out", "specserve sim leaderboard --scenarios two-rates.yaml")
    text = written[0].read_text()
    assert "## Static rates" in text and "| two-rates | 8 |" in text and all(p.stat().st_size > 0 for p in written)


def test_cells_hold_the_mean_over_seeds(tmp_path) -> None:
    path = str(two_rate_file(tmp_path))
    board = evaluate("adaptive", [path], seeds=(3, 4), static_window_s=6.0, workers=2)
    cell = next(c for c in board.whole)
    runs = [run_scenario(load_scenario(path), "fixed:k=2", seed) for seed in (3, 4)]
    expected = sum(r["throughput_tok_s"] for r in runs) / 2
    assert cell.results["fixed:k=2"]["throughput_tok_s"] == pytest.approx(expected)
    assert runs[0]["throughput_tok_s"] != runs[1]["throughput_tok_s"]
    with pytest.raises(ValueError, match="seeds is empty"):
        evaluate("adaptive", [path], seeds=())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "nosuch"], "unknown policy 'nosuch'"),
        (["--seeds", "0"], "--seeds 0"),
        (["--scenarios", "no-such-scenario"], "no-such-scenario"),
    ],
)
def test_cli_errors_name_the_bad_value(args, message) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "specserve", "sim", "leaderboard", *args], capture_output=True, text=True
    )
    assert done.returncode == 2 and message in done.stderr


def test_cli_json(tmp_path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "specserve",
            "sim",
            "leaderboard",
            "--scenarios",
            str(two_rate_file(tmp_path)),
            "--seeds",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode in (0, 1), done.stderr
    document = json.loads(done.stdout)
    assert document["policy"] == "adaptive" and len(document["static"]) == 2
    assert document["passed"] == (done.returncode == 0)
