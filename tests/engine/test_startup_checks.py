"""The start-up calibration on real CPU engines: it passes where specserve's control holds, each check fails where
its assumption is broken on purpose (a worker that drafts max_k whatever k is asked, one that never skips the draft's
pass, one whose drafts come without signals), and a failure falls back to fixed:k=max_k or refuses to serve.
`specserve doctor` runs the same on the bundled tiny pair."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from engine_helpers import running_engine

from specserve.replicas.serve.calibration import OfflineEngine, StartupCheckFailed, calibrate


def run_calibration(engine, *, max_k: int, on_failure: str = "fallback", policy: str = "adaptive"):
    return asyncio.run(
        calibrate(
            OfflineEngine(engine.llm),
            policy=policy,
            max_k=max_k,
            max_num_seqs=8,
            skips_k0_draft_pass=True,
            signals=True,
            on_failure=on_failure,
            batch_sizes=(1, 4),
        )
    )


@pytest.fixture(scope="module")
def engine(trained_pair):
    with running_engine(
        trained_pair, policy="adaptive", max_k=3, worker_extension_cls="breakable_worker.Breakable"
    ) as engine:
        yield engine


def break_worker(engine, name: str | None) -> None:
    engine.llm.collective_rpc("specserve_test_break", args=(name,))


def test_the_checks_pass_and_the_policy_starts_from_the_runs_step_costs_not_their_acceptance(engine):
    break_worker(engine, None)
    engine.set_policy("adaptive", warm_start=False)
    fresh = engine.telemetry().policy.info
    calibration = run_calibration(engine, max_k=3)
    assert [(c.name, c.ok) for c in calibration.checks] == [
        ("k_honoured", True),
        ("k0_no_draft_pass", True),
        ("draft_signals", True),
    ]
    assert [(r.probe.k, r.probe.batch) for r in calibration.results] == [(k, b) for b in (1, 4) for k in range(4)]
    assert all(r.step_s for r in calibration.results), "every run timed decode steps at its full batch"
    after = engine.telemetry()
    assert calibration.policy == after.policy.spec and after.policy.spec.startswith("adaptive")
    assert after.failed_checks == ()
    # As if the dummy runs never happened: no steps, no acceptance evidence, the policy's prior untouched.
    assert after.speculation.num_steps == 0 and sum(after.speculation.num_reached_per_pos) == 0
    assert after.policy.info["alpha_0"] == fresh["alpha_0"]
    # But the step-cost fit learned from them.
    latency = {key: value for key, value in after.policy.info.items() if key.startswith("latency_")}
    assert latency and latency != {key: fresh[key] for key in latency}


@pytest.mark.parametrize(
    ("broken", "check"),
    [("drafts_max_k", "k_honoured"), ("never_skips", "k0_no_draft_pass"), ("no_signals", "draft_signals")],
)
def test_a_broken_assumption_fails_its_check_and_falls_back_to_vllms_own_behaviour(engine, broken, check):
    break_worker(engine, broken)
    try:
        if check == "k_honoured":
            with pytest.raises(StartupCheckFailed, match="k_honoured: expected every draft proposal as wide"):
                run_calibration(engine, max_k=3, on_failure="refuse")
        calibration = run_calibration(engine, max_k=3)
        assert calibration.failed == (check,), calibration.checks
        assert engine.telemetry().failed_checks == (check,)
        served = engine.telemetry().policy.spec
        assert calibration.policy == served == engine.set_policy("fixed:k=3"), "the fallback is fixed:k=max_k"
        # The fallback serves, and greedy output is still plain decoding's.
        reference = engine.generate(max_tokens=24)
    finally:
        break_worker(engine, None)
    engine.set_policy("fixed:k=0")
    assert engine.generate(max_tokens=24) == reference


def test_doctor_prints_the_checks_and_costs_of_the_tiny_pair_and_what_speculation_pays_on_prompts(
    trained_pair, tmp_path
):
    env = {**os.environ, "SPECSERVE_STATE_DIR": str(tmp_path)}
    prompts = tmp_path / "prompts.txt"
    prompts.write_text('import os\n{"prompt": "def main(argv=None):\\n    "}\nclass Config:\n')
    done = subprocess.run(
        [sys.executable, "-m", "specserve", "doctor", "--max-k", "2", "--prompts", str(prompts), "--max-tokens", "16"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=Path(__file__).parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    checks, costs, acceptance, payoff, best = "\n".join(done.stdout.splitlines()).split("\n\n")
    lines = checks.splitlines()
    assert lines[0].split() == ["CHECK", "EXPECTED", "SEEN", "OK"]
    assert [line.split()[0] for line in lines[1:4]] == ["k_honoured", "k0_no_draft_pass", "draft_signals"]
    assert all(line.rstrip().endswith("ok") for line in lines[1:4])
    timed = [row.split() for row in costs.splitlines()[1:]]
    assert {(row[0], row[1]) for row in timed} == {(str(k), str(b)) for k in range(3) for b in (1, 4, 8)}
    # The prompts' drafts are counted per position, at the engine's max k; the trained pair accepts some.
    rates = acceptance.split(": ")[-1].split()
    assert acceptance.startswith("acceptance per draft position on 3 prompts at k = 2") and len(rates) == 2
    assert 0.0 < float(rates[0]) <= 1.0
    priced = [row.split() for row in payoff.splitlines()[1:]]
    assert [(row[0], row[1]) for row in priced] == [(row[0], row[1]) for row in timed]
    assert all(row[2:] == ["1.00", "1.00"] for row in priced if row[0] == "0")
    assert all(float(row[2]) > 1.0 for row in priced if row[0] != "0")
    assert best.startswith("best k: batch 1: k = ")
    assert "every check passed" in done.stderr
