"""``specserve sim``: scenarios and compare on stdout, compare --json, the --policies splitting rule and exit
status 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sim_helpers import SMALL_YAML, sim_cli

from specserve.sim import builtin_scenarios
from specserve.sim.cli import CommandError, split_policies

SMALL = SMALL_YAML
sim = sim_cli


def test_split_policies_keeps_parameters_with_their_policy() -> None:
    assert split_policies("fixed:k=0,fixed:k=3,adaptive") == ["fixed:k=0", "fixed:k=3", "adaptive"]
    assert split_policies("fixed:k=0,goodput:max_k=4,probe_k=1,adaptive") == [
        "fixed:k=0",
        "goodput:max_k=4,probe_k=1",
        "adaptive",
    ]
    with pytest.raises(CommandError, match="k=1"):
        split_policies("k=1,fixed")
    with pytest.raises(CommandError, match="empty"):
        split_policies("fixed,,adaptive")


def test_scenarios_lists_builtins_on_stdout() -> None:
    # The list is the command's result: `specserve sim scenarios | grep nightjar` must find it.
    out = sim("scenarios")
    assert out.returncode == 0 and out.stderr == ""
    names = [line.split()[0] for line in out.stdout.splitlines()]
    assert names == sorted(builtin_scenarios())
    assert "turbospec-h100-qps-sweep" in names and "nightjar-4090-7b-dynamic" in names
    listed = json.loads(sim("scenarios", "--json").stdout)
    assert [row["name"] for row in listed["scenarios"]] == names


def test_compare_json(tmp_path) -> None:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    out = sim(
        "compare", "--scenario", str(path), "--policies", "fixed:k=0,goodput:max_k=3,probe_k=1", "--json", "--seed", "3"
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["scenario"] == "small"
    assert [r["policy"] for r in doc["results"]] == ["fixed:k=0", "goodput:max_k=3,probe_k=1"]
    keys = {
        "throughput_tok_s",
        "goodput_tok_s",
        "slo_attainment",
        "mean_e2e_s",
        "p99_e2e_s",
        "mean_ttft_s",
        "mean_tpot_s",
        "acceptance",
        "mean_k",
        "k_switches",
        "wall_s",
    }
    assert all(keys <= set(r) for r in doc["results"])
    assert all(r["slo_attainment"] is None for r in doc["results"])  # the scenario has no TPOT SLO
    assert doc["results"][0]["mean_k"] == 0


def test_compare_table_goes_to_stdout_and_the_progress_bar_to_stderr(tmp_path) -> None:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    out = sim("compare", "--scenario", str(path), "--policies", "fixed:k=0,fixed:k=2")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "scenario small" and lines[1].split()[:2] == ["POLICY", "TOK/S"]
    assert [line.split()[0] for line in lines[2:]] == ["fixed:k=0", "fixed:k=2"]
    assert "policy" in out.stderr and "fixed:k=0" not in out.stderr  # tqdm's bar, and nothing of the table


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--scenario", "no-such-scenario"), "no-such-scenario"),
        (("--scenario", "turbospec-h100-qps-sweep", "--policies", "fixed:k=0,nosuch"), "nosuch"),
        (("--scenario", "turbospec-h100-qps-sweep", "--policies", "fixed:k=99"), "k=99"),
        (("--scenario", "turbospec-h100-qps-sweep", "--policies", "goodput:bogus=1"), "bogus"),
        (("--scenario", "cluster-4090-7b-64x-hour", "--workers", "9"), "workers=9"),
        (("--scenario", "cluster-4090-7b-64x-hour", "--workers", "2", "--sync-s", "0"), "sync_s=0.0"),
    ],
)
def test_bad_scenario_or_policy_exits_2_naming_it(args: tuple[str, ...], named: str) -> None:
    out = sim("compare", *args, "--json")
    assert out.returncode == 2
    assert named in out.stderr
    assert out.stdout == ""


def test_compare_runs_without_the_lab_extra(tmp_path) -> None:
    # matplotlib is the lab extra's, not a runtime dependency, and the simulator needs no progress bar: an install
    # without either must still simulate.
    scenario = tmp_path / "small.yaml"
    scenario.write_text(SMALL)
    code = (
        "import sys; sys.modules['tqdm'] = sys.modules['matplotlib'] = None; "
        "from specserve.cluster.cli import main; "
        f"sys.exit(main(['sim', 'compare', '--scenario', {str(scenario)!r}, '--policies', 'fixed:k=0', '--json']))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["results"][0]["policy"] == "fixed:k=0"
