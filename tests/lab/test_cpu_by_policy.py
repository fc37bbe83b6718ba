"""lab/studies/policy_cost/cpu_by_policy.py: a run's step parts from its step log, and the summary's paired ratios
(the served load itself needs a server: run by hand, results in bench/results/policy-time-parts-tiny*.md)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from lab_scripts import ROOT, run_script

SCRIPT = "lab/studies/policy_cost/cpu_by_policy.py"


def study():
    spec = importlib.util.spec_from_file_location("cpu_by_policy", ROOT / SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def logged(now_s: float, running_before: int, duration_s: float, forward_s: float, draft_s: float, k: int = 0) -> str:
    record = {"now_s": now_s, "k": k, "duration_s": duration_s, "forward_s": forward_s, "draft_s": draft_s}
    return json.dumps({"ctx": {"num_running": running_before}, "record": record | {"num_draft_passes": int(k > 0)}})


def test_a_runs_parts_leave_out_the_engine_waiting_for_the_client() -> None:
    lines = [
        logged(0.0, 0, 0.010, 0.006, 0.001),  # a request arrives at an idle engine
        logged(0.011, 1, 0.010, 0.006, 0.001, k=1),  # 1 ms after the last step ended: the engine's own time
        logged(5.0, 0, 0.010, 0.006, 0.001),  # 5 s idle before it: the client's, left out
    ]
    parts = study().step_parts(lines, output_tokens=10)
    assert abs(parts["forward"] - 1e3 * 0.018 / 10) < 1e-12
    assert abs(parts["between steps"] - 1e3 * 0.001 / 10) < 1e-12
    assert abs(parts["rest of the step"] - 1e3 * 0.009 / 10) < 1e-12
    assert (parts["steps"], parts["steps at k > 0"], parts["draft passes run"]) == (3, 1, 1)


def test_the_ratio_from_the_parts_cancels_the_machines_drift(tmp_path: Path) -> None:
    # Round 1 ran on a machine twice as slow as round 0: every part doubled, and the client's tokens/s halved.
    runs = []
    for round_index, slow in ((0, 1.0), (1, 2.0)):
        for arm, rest in (("fixed:k=0", 0.25), ("adaptive", 0.30)):
            parts = {"forward": slow, "draft passes": 0.0, "rest of the step": rest * slow, "between steps": 0.0}
            rate = 1000.0 / slow / (1.0 + rest)
            runs.append(
                {
                    "round": round_index,
                    "arm": arm,
                    "output_throughput": rate,
                    "cpu_ms_per_output_token": {"engine": slow},
                    "step_ms_per_output_token": parts,
                }
            )
    path = tmp_path / "parts.json"
    path.write_text(json.dumps({"command": "test", "settings": {"arms": "fixed:k=0,adaptive"}, "runs": runs}))
    done = run_script(SCRIPT, "--summarize", str(path))
    assert done.returncode == 0, done.stderr
    adaptive = json.loads(path.read_text())["summary"]["adaptive"]
    assert adaptive["tok_s_ratio_from_parts"]["rounds"] == [1.25 / 1.30] * 2
    assert abs(adaptive["over_forward"]["rest of the step"]["median"] - 0.05 / 1.25) < 1e-12
    assert "0.962" in path.with_suffix(".md").read_text()
