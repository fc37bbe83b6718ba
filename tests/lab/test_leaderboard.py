"""The leaderboard: static cells per distinct rate, the best rival per metric, the saturation rule, the verdicts,
the report and the CLI's errors."""

from __future__ import annotations

import json

import pytest
import yaml
from lab_scripts import lab_cli
from sim_helpers import small_scenario

from lab.experiments.leaderboard import (
    GOODPUT,
    LATENCY,
    MEAN_E2E,
    MEAN_TPOT,
    ORACLE,
    P99_E2E,
    THROUGHPUT,
    Cell,
    Leaderboard,
    at_static_rate,
    evaluate,
    full_share,
    is_dynamic,
    rivals,
    static_rates,
)
from lab.experiments.leaderboard_report import write_report
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


def row(e2e: float, p99: float, tpot: float, tput: float, goodput: float, full: float = 0.0, span: float = 60.0):
    return {
        "mean_e2e_s": e2e,
        "p99_e2e_s": p99,
        "mean_tpot_s": tpot,
        "p99_tpot_s": 2 * tpot,
        "throughput_tok_s": tput,
        "goodput_tok_s": goodput,
        "full_share": full,
        "arrival_span_s": span,
        "k_switches": 0,
        "mean_k": 1.0,
    }


def test_best_rival_per_metric_on_a_hand_built_table() -> None:
    cell = Cell(
        "s",
        1.0,
        {
            "ours": row(1.00, 5.0, 0.020, 100, 90),
            "fast": row(0.95, 6.0, 0.021, 101, 80),  # best mean E2E and throughput
            "tail": row(1.10, 4.0, 0.019, 99, 95),  # best p99 E2E, TPOT and goodput
            ORACLE: row(0.50, 1.0, 0.001, 500, 500),  # better at everything, and never a rival
        },
        has_slo=True,
    )
    assert cell.best_rival("ours", MEAN_E2E) == "fast" and cell.ratio("ours", MEAN_E2E) == pytest.approx(1 / 0.95)
    assert cell.best_rival("ours", P99_E2E) == "tail" and cell.ratio("ours", P99_E2E) == pytest.approx(5 / 4)
    assert cell.best_rival("ours", MEAN_TPOT) == "tail" and cell.ratio("ours", MEAN_TPOT) == pytest.approx(20 / 19)
    assert cell.best_rival("ours", THROUGHPUT) == "fast" and cell.ratio("ours") == pytest.approx(100 / 101)
    assert cell.best_rival("ours", GOODPUT) == "tail" and cell.ratio("ours", GOODPUT) == pytest.approx(90 / 95)
    # Each policy's rivals leave out itself: "fast" is measured against "ours" on mean E2E.
    assert cell.best_rival("fast", MEAN_E2E) == "ours"
    assert cell.oracle_ratio("ours") == pytest.approx(90 / 500)
    assert cell.oracle_ratio("ours", MEAN_E2E) == pytest.approx(2.0)
    # Open, so throughput is not compared; the SLO adds goodput.
    assert cell.load == "open" and cell.metrics() == [*LATENCY, GOODPUT]


def test_saturation_rule() -> None:
    # Steps (start, duration) that left requests unscheduled, in an arrival window from 10 s to 20 s: the share
    # of the window they cover, a step running past the window's end counted up to it.
    assert full_share([(12.0, 1.0), (19.5, 2.0), (5.0, 4.0), (20.0, 1.0)], 10.0, 20.0) == pytest.approx(0.15)
    assert full_share([(0.0, 1.0)], 0.0, 0.0) == 0.0
    specs = {f"p{i}": row(1, 1, 0.01, 100, 100, full=share) for i, share in enumerate((0.0, 0.1, 0.3, 0.5, 0.9))}
    assert Cell("s", 1.0, specs).saturated  # the median policy (0.3) left requests unscheduled
    specs["p2"] = row(1, 1, 0.01, 100, 100, full=0.19)
    cell = Cell("s", 1.0, specs)
    assert not cell.saturated and cell.load == "open" and THROUGHPUT not in cell.metrics()
    saturated = Cell("s", 1.0, {**specs, "p1": row(1, 1, 0.01, 100, 100, full=0.6)})
    assert saturated.load == "saturated" and saturated.metrics() == [*LATENCY, THROUGHPUT]
    offline = Cell("s", None, {spec: row(1, 1, 0.01, 100, 100, span=0.0) for spec in ("a", "b")})
    assert offline.load == "offline" and THROUGHPUT in offline.metrics()


def test_verdicts_on_a_hand_built_board() -> None:
    def cell(ours_e2e: float, ours_p99: float, ours_goodput: float) -> Cell:
        return Cell(
            "s",
            1.0,
            {
                "adaptive": row(ours_e2e, ours_p99, 0.01, 100, ours_goodput),
                "bandit": row(1.0, 1.0, 0.01, 100, 100),
                ORACLE: row(0.9, 0.9, 0.01, 100, 100),
            },
        )

    at_the_bars = Leaderboard("adaptive", (0,), [cell(1.02, 1.05, 97), cell(0.9, 0.9, 97)], [], [])
    assert at_the_bars.latency_pass() and at_the_bars.oracle_pass()
    assert at_the_bars.oracle_distances()["adaptive"] == pytest.approx(0.97)
    assert at_the_bars.oracle_distances(MEAN_E2E)["adaptive"] == pytest.approx((1.02 + 0.9) / 0.9 / 2)
    assert at_the_bars.throughput_cells() == [] and at_the_bars.throughput_pass()
    assert not Leaderboard("adaptive", (0,), [cell(1.021, 1.0, 100)], [], []).latency_pass()
    assert not Leaderboard("adaptive", (0,), [cell(1.0, 1.051, 100)], [], []).latency_pass()
    below = Leaderboard("adaptive", (0,), [cell(1.0, 1.0, 96), cell(1.0, 1.0, 97)], [], [])
    assert below.latency_pass() and not below.oracle_pass() and not below.passed()


def test_evaluate_and_report(tmp_path) -> None:
    board = evaluate("adaptive", [str(two_rate_file(tmp_path))], seeds=(0,), static_window_s=6.0, workers=2)
    assert [cell.rate_qps for cell in board.static] == [2, 8]
    specs = {"adaptive", ORACLE, *rivals("adaptive", 4)}
    assert len(board.dynamic) == 1 and set(board.dynamic[0].results) == specs
    assert all(set(cell.results) == specs and cell.load == "open" for cell in board.static)
    assert ORACLE not in board.dynamic_means() and set(board.oracle_distances()) == specs - {ORACLE}
    means = board.dynamic_means()
    # One dynamic scenario: each policy's mean is its throughput over that scenario's best, so the best scores 1,
    # the list runs best first, and dynamic_pass says whether the policy under test is that best.
    cell = board.dynamic[0]
    best = max(set(cell.results) - {ORACLE}, key=lambda spec: cell.results[spec]["throughput_tok_s"])
    assert next(iter(means)) == best and means[best] == pytest.approx(1.0)
    assert list(means.values()) == sorted(means.values(), reverse=True) and all(0 < v <= 1 for v in means.values())
    assert board.dynamic_pass() == (best == "adaptive")
    assert board.switches()[0][0] == "two-rates"
    written = write_report(board, tmp_path / "out", "python -m lab leaderboard --scenarios two-rates.yaml")
    text = written[0].read_text()
    assert "## End-to-end latency at every static rate" in text and "| two-rates | 8 | open |" in text
    assert "## Distance to the oracle" in text and all(p.stat().st_size > 0 for p in written)
    assert [p.name for p in written] == [
        "adaptive.md",
        "adaptive-static.png",
        "adaptive-oracle.png",
        "adaptive-dynamic.png",
    ]


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
        (["--policy", "oracle:kk=1"], "has no parameter 'kk'"),
        (["--seeds", "0"], "--seeds 0"),
        (["--scenarios", "no-such-scenario"], "no-such-scenario"),
    ],
)
def test_cli_errors_name_the_bad_value(args, message) -> None:
    done = lab_cli("leaderboard", *args)
    assert done.returncode == 2 and message in done.stderr


def test_cli_json(tmp_path) -> None:
    done = lab_cli("leaderboard", "--scenarios", str(two_rate_file(tmp_path)), "--seeds", "1", "--json")
    assert done.returncode in (0, 1), done.stderr
    document = json.loads(done.stdout)
    assert document["policy"] == "adaptive" and len(document["static"]) == 2
    assert document["passed"] == (done.returncode == 0) == all(document["verdicts"].values())
    assert set(document["verdicts"]) == {"latency", "oracle", "throughput", "dynamic", "switches"}
    first = document["static"][0]
    assert set(first["compared"]) == {"mean_e2e_s", "p99_e2e_s", "mean_tpot_s", "p99_tpot_s"}
    assert first["compared"]["mean_e2e_s"]["best_rival"] != ORACLE and first["oracle_ratio"]["goodput_tok_s"] > 0


def test_the_default_leaves_out_only_the_cluster_rehearsals():
    from lab.experiments.leaderboard import single_replica_scenarios
    from specserve.sim.scenario import builtin_scenarios, load_scenario

    default = set(single_replica_scenarios())
    left_out = set(builtin_scenarios()) - default
    assert left_out and all(load_scenario(name).num_replicas > 1 for name in left_out)
    assert all(load_scenario(name).num_replicas == 1 for name in default)
