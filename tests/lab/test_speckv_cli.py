"""``python -m lab mlp-samples`` and ``train-mlp``: samples from a run, weights from samples,
mlp:weights=FILE in compare."""

from __future__ import annotations

import json

import pytest
import yaml
from lab_scripts import lab_cli
from sim_helpers import SMALL_YAML

from lab.speckv.mlp_dump import collect_samples, default_policy
from specserve.sim.scenario import parse_scenario
from specserve.speculation.speckv.model import FEATURE_NAMES, weights_from_json

SMALL = SMALL_YAML
sim = lab_cli


@pytest.fixture
def scenario_file(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    return path


def test_round_trip_samples_train_compare(tmp_path, scenario_file) -> None:
    samples, weights = tmp_path / "samples.jsonl", tmp_path / "weights.json"
    out = sim("mlp-samples", "--scenario", str(scenario_file), "--out", str(samples), "--max-samples", "400")
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in samples.read_text().splitlines()]
    assert 0 < len(lines) <= 400
    assert {line["gamma"] for line in lines} <= {1, 2, 3, 4} and {2, 4} <= {line["gamma"] for line in lines}
    assert all(set(FEATURE_NAMES) <= set(line) and 0 <= line["acceptance_rate"] <= 1 for line in lines)

    out = sim("train-mlp", str(samples), "--out", str(weights), "--epochs", "3")
    assert out.returncode == 0, out.stderr
    assert weights_from_json(weights.read_text()).provenance.startswith("trained on samples.jsonl")

    out = sim("compare", "--scenario", str(scenario_file), "--policies", f"mlp,mlp:weights={weights}", "--json")
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)["results"]
    assert [r["policy"] for r in results] == ["mlp", f"mlp:weights={weights}"]
    assert all(r["mean_k"] > 0 for r in results)


def test_samples_are_reproducible_and_subsampled_over_the_whole_run(scenario_file) -> None:
    scenario = parse_scenario({"name": "small", **yaml.safe_load(SMALL)})
    assert default_policy(4) == "cycle:ks=2-4" and default_policy(8) == "cycle:ks=2-4-6-8"
    assert default_policy(1) == "cycle:ks=1"
    everything, seen = collect_samples(scenario, "cycle:ks=2-4", seed=1, max_samples=10**6)
    assert len(everything) == seen > 50
    some, seen_again = collect_samples(scenario, "cycle:ks=2-4", seed=1, max_samples=20)
    assert seen_again == seen and len(some) == 20
    assert some == collect_samples(scenario, "cycle:ks=2-4", seed=1, max_samples=20)[0]
    positions = [everything.index(sample) for sample in some]
    assert positions == sorted(positions) and positions[-1] > seen // 2  # not just the run's first steps


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("train-mlp", "{tmp}/missing.jsonl", "--out", "{tmp}/w.json"), "missing.jsonl' not found"),
        (("train-mlp", "{tmp}/bad.jsonl", "--out", "{tmp}/w.json"), "line 2: not a sample"),
        (("train-mlp", "{tmp}/empty.jsonl", "--out", "{tmp}/w.json"), "holds no samples"),
        (("train-mlp", "{tmp}/bad.jsonl", "--out", "{tmp}/w.json", "--epochs", "0"), "--epochs 0"),
        (("compare", "--scenario", "{scenario}", "--policies", "mlp:weights={tmp}/missing.json"), "missing.json"),
        (
            ("compare", "--scenario", "{scenario}", "--policies", "mlp:weights={tmp}/bad.jsonl"),
            "not an mlp weights file",
        ),
        (("mlp-samples", "--scenario", "{scenario}", "--policy", "fixed:k=0", "--out", "{tmp}/s.jsonl"), "no samples"),
        (("mlp-samples", "--scenario", "{scenario}", "--policy", "cycle:ks=9", "--out", "{tmp}/s.jsonl"), "max_k=4"),
        (("mlp-samples", "--scenario", "{scenario}", "--out", "{tmp}/no/such/dir.jsonl"), "cannot write"),
    ],
)
def test_errors_are_one_line_and_exit_2(tmp_path, scenario_file, args, message) -> None:
    good = json.dumps(
        {
            "mean_draft_entropy": 1.0,
            "mean_draft_confidence": 0.7,
            "max_draft_entropy": 2.0,
            "min_draft_confidence": 0.5,
            "compression": "fp16",
            "gamma": 4,
            "acceptance_rate": 0.5,
        }
    )
    (tmp_path / "bad.jsonl").write_text(good + "\n{not json\n")
    (tmp_path / "empty.jsonl").write_text("\n")
    out = sim(*(a.format(tmp=tmp_path, scenario=scenario_file) for a in args))
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and message in out.stderr
