"""Serve tier: `specserve bench run` against a real `specserve serve`, checking its accounting."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from serve_process import API_KEY, free_port

REQUESTS, MAX_TOKENS = 12, 16


def bench(server, *args: str, key: str | None = API_KEY) -> subprocess.CompletedProcess:
    """`bench run` with the key in OPENAI_API_KEY, as vLLM's bench client takes it (none if ``key`` is None)."""
    cmd = [sys.executable, "-m", "specserve.cluster.cli", "bench", "run", "--url", server.endpoint, *args]
    env = {name: value for name, value in server.env.items() if name != "OPENAI_API_KEY"}
    if key is not None:
        env["OPENAI_API_KEY"] = key
    # The run's own per-request timeout keeps it bounded; this one only guards the test.
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def test_closed_loop_accounting(server):
    result = bench(
        server,
        *("--concurrency", "4", "--num-requests", str(REQUESTS), "--input-len", "24", "--output-len", str(MAX_TOKENS)),
        *("--json", "--per-request", "--slo-e2e-ms", "600000"),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)  # one JSON document, nothing else on stdout
    assert report["model"] == "specserve-tiny" and report["ignore_eos"] is True
    assert report["requests"] == {"sent": REQUESTS, "completed": REQUESTS, "failed": 0}
    assert report["errors"] == {}
    rows = report["per_request"]
    assert sorted(r["index"] for r in rows) == list(range(REQUESTS))
    assert report["tokens"]["output"] == REQUESTS * MAX_TOKENS == sum(r["max_tokens"] for r in rows)
    assert all(r["output_tokens"] == MAX_TOKENS and r["prompt_tokens"] > 0 for r in rows)
    assert report["tokens"]["input"] == sum(r["prompt_tokens"] for r in rows)
    assert all(0 < r["ttft_ms"] <= r["e2e_ms"] for r in rows)
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        stats = report[name]
        assert 0 <= stats["p50"] <= stats["p90"] <= stats["p99"], name
    assert report["throughput"]["output_tokens_per_s"] == pytest.approx(REQUESTS * MAX_TOKENS / report["duration_s"])
    assert report["goodput"]["requests_ok"] == REQUESTS and report["goodput"]["share"] == 1.0


def test_a_closed_loop_for_a_duration_reports_its_window(server):
    window_s = 3.0
    result = bench(
        server,
        *("--concurrency", "2", "--duration", str(window_s), "--input-len", "24", "--output-len", str(MAX_TOKENS)),
        *("--json", "--per-request"),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    window, rows = report["window"], report["per_request"]
    assert window["s"] == window_s and report["duration_s"] >= window_s
    # Every request answered before the window closed is inside it whole; one still streaming is in part.
    finished = sum(r["output_tokens"] for r in rows if r["sent_s"] + r["e2e_ms"] / 1000.0 <= window_s)
    assert finished <= window["output_tokens"] <= report["tokens"]["output"]
    assert window["output_tokens"] < report["tokens"]["output"]  # the last requests drained after the window
    assert window["output_tokens_per_s"] == pytest.approx(window["output_tokens"] / window_s)


def test_wrong_model_errors_counted_by_http_status(server):
    result = bench(server, "--concurrency", "2", "--num-requests", "6", "--model", "no-such-model", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["requests"] == {"sent": 6, "completed": 0, "failed": 6}
    assert list(report["errors"]) == ["http_404"] and report["errors"]["http_404"]["count"] == 6
    assert report["ttft_ms"]["p50"] is None and report["throughput"]["output_tokens_per_s"] == 0
    assert "HTTP 404" in result.stderr  # the probe's note


def test_open_loop_rate_with_exact_prompt_lengths(server, trained_pair):
    lengths = ("--input-len", "40", "--output-len", "8", "--tokenizer", str(trained_pair.target))
    result = bench(server, "--rate", "4", "--num-requests", "6", *lengths, "--json", "--per-request", "--no-progress")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["requests"]["completed"] == 6 and report["tokens"]["output"] == 48
    # The server's count: the 40 prompt tokens, plus a BOS token if its tokenizer adds one.
    assert {r["prompt_tokens"] for r in report["per_request"]} <= {40, 41}
    assert report["max_send_lag_ms"] is not None and result.stderr == ""


@pytest.mark.parametrize(("key", "says"), [(None, "export OPENAI_API_KEY"), ("wrong", "refused the key")])
def test_a_missing_or_refused_key_is_a_cli_error_before_any_load(server, key, says):
    # Without --model the models list fails first; with it, the probe request does.
    for model in ((), ("--model", "specserve-tiny")):
        result = bench(server, "--concurrency", "1", "--num-requests", "2", *model, key=key)
        assert result.returncode == 2 and "HTTP 401" in result.stderr and says in result.stderr, result.stderr
        assert result.stdout == ""


def test_unreachable_url_is_a_cli_error(server):
    result = bench(server, "--concurrency", "1", "--model", "m", "--url", f"http://127.0.0.1:{free_port()}/v1")
    assert result.returncode == 2 and "unreachable" in result.stderr and result.stdout == ""


def in_flight(rows: list[dict], t_s: float) -> int:
    return sum(r["sent_s"] <= t_s < r["sent_s"] + r["e2e_ms"] / 1000.0 for r in rows)


def test_a_client_schedule_changes_how_many_requests_are_in_flight(server):
    result = bench(
        server,
        *("--clients", "1:3,3:3", "--input-len", "24", "--output-len", str(MAX_TOKENS), "--json", "--per-request"),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    rows, phases = report["per_request"], report["window"]["phases"]
    assert report["load"]["kind"] == "clients" and report["window"]["s"] == 6.0
    # One client sends in the first 3 s: never two requests at once there; three from then on.
    assert all(r["sent_s"] >= 3.0 or in_flight(rows, r["sent_s"]) == 1 for r in rows)
    assert max(in_flight(rows, r["sent_s"]) for r in rows if r["sent_s"] >= 3.0) > 1
    assert [(p["clients"], p["start_s"], p["s"]) for p in phases] == [(1, 0.0, 3.0), (3, 3.0, 3.0)]
    assert sum(p["output_tokens"] for p in phases) == pytest.approx(report["window"]["output_tokens"])
    assert phases[1]["output_tokens"] > phases[0]["output_tokens"] > 0


def test_compare_switches_policies_between_interleaved_rounds(server, tmp_path):
    out = tmp_path / "cpu-compare"
    cmd = [sys.executable, "-m", "specserve.cluster.cli", "bench", "compare", "--url", server.endpoint]
    cmd += ["--policies", "fixed:k=0,fixed:k=2", "--concurrency", "2", "--rounds", "2", "--num-requests", "4"]
    cmd += ["--input-len", "24", "--output-len", str(MAX_TOKENS), "--warmup", "2", "--out", str(out)]
    result = subprocess.run(
        cmd, env=server.env | {"OPENAI_API_KEY": API_KEY}, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [f"{out}{end}" for end in (".md", ".json", "-tok_s.png", "-tok_s-ratio.png")]

    document = json.loads(out.with_suffix(".json").read_text())
    runs = document["runs"]
    assert [(r["round"], r["policy"]) for r in runs] == [
        (0, "fixed:k=0"),
        (0, "fixed:k=2"),
        (1, "fixed:k=0"),
        (1, "fixed:k=2"),
    ]
    assert all(r["report"]["requests"] == {"sent": 4, "completed": 4, "failed": 0} for r in runs)
    # The engine's own step counts: each run's steps all ran at its policy's k, so the switch had landed
    # before the run and no other run's steps were counted in.
    for r in runs:
        steps, k = r["steps_by_k"], int(r["policy"][-1])
        assert steps[k] > 0 and sum(steps) == steps[k], (r["policy"], steps)
    page = out.with_suffix(".md").read_text()
    assert "| `fixed:k=2` | " in page and "## concurrency 2 (2 rounds)" in page

    status = subprocess.run(
        [sys.executable, "-m", "specserve.cluster.cli", "status", "--json"],
        env=server.env,
        capture_output=True,
        text=True,
    )
    # Left as it was found: the server's default policy.
    assert [r["engine"]["policy"] for r in json.loads(status.stdout)["replicas"]] == ["adaptive"]
