"""The load generator's accounting against hand-computed values (vLLM's metric definitions)."""

from __future__ import annotations

import pytest
from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

from specserve.bench.client import Outcome, classify
from specserve.bench.load import Phase
from specserve.bench.report import errors, stats_ms, summarize, table


def ok(index: int, ttft: float, itl: list[float], tokens: int, prompt: int = 10, sent_s: float = 0.0) -> Outcome:
    latency = ttft + sum(itl)
    out = RequestFuncOutput(success=True, ttft=ttft, itl=itl, latency=latency, output_tokens=tokens, prompt_len=prompt)
    return Outcome(index, tokens, out, None, None, sent_s)


def failed(index: int, kind: str, error: str) -> Outcome:
    return Outcome(index, 4, RequestFuncOutput(success=False, error=error), kind, None, 0.0)


def test_percentiles_interpolate_linearly():
    # numpy's linear rule on 1..5 s: p50 = 3, p90 = 4.6, p99 = 4.96.
    assert stats_ms([1, 2, 3, 4, 5]) == pytest.approx({"mean": 3000, "p50": 3000, "p90": 4600, "p99": 4960})
    assert stats_ms([]) == {"mean": None, "p50": None, "p90": None, "p99": None}


def test_summary_by_hand():
    outcomes = [
        ok(0, ttft=0.1, itl=[0.02, 0.02, 0.02], tokens=4),  # e2e 0.16, tpot (0.16 - 0.1) / 3 = 0.02
        ok(1, ttft=0.3, itl=[0.05], tokens=3, prompt=20),  # two tokens in one chunk: tpot (0.35 - 0.3) / 2 = 0.025
        ok(2, ttft=0.2, itl=[], tokens=1),  # one token: no TPOT, counts as 0 for goodput
        failed(3, "http_404", "Not Found"),
    ]
    report = summarize(outcomes, duration_s=2.0, slo_ms={"ttft": 250, "tpot": 22})
    assert report["requests"] == {"sent": 4, "completed": 3, "failed": 1}
    assert report["tokens"] == {"input": 40, "output": 8}
    assert report["throughput"] == pytest.approx(
        {"requests_per_s": 1.5, "output_tokens_per_s": 4, "total_tokens_per_s": 24}
    )
    assert report["ttft_ms"]["mean"] == pytest.approx(200) and report["ttft_ms"]["p50"] == pytest.approx(200)
    assert report["tpot_ms"]["mean"] == pytest.approx(22.5) and report["tpot_ms"]["p90"] == pytest.approx(24.5)
    assert report["itl_ms"]["mean"] == pytest.approx(27.5)  # (20 + 20 + 20 + 50) / 4
    assert report["e2e_ms"]["mean"] == pytest.approx((160 + 350 + 200) / 3)
    # Requests 0 (ttft 100, tpot 20) and 2 (ttft 200, tpot 0) meet both; 1 misses both; 3 failed.
    goodput = report["goodput"]
    assert goodput.pop("slo_ms") == {"ttft": 250, "tpot": 22}
    assert goodput == pytest.approx({"requests_ok": 2, "share": 0.5, "requests_per_s": 1.0, "output_tokens_per_s": 2.5})
    assert report["errors"] == {"http_404": {"count": 1, "example": "Not Found"}}
    assert summarize(outcomes, 2.0, {})["goodput"] is None


def test_window_counts_tokens_streamed_before_it_closes():
    outcomes = [
        # Chunks at 1, 2, 3, 4 s: the first carries 1 token, the other 6 spread over three chunks.
        ok(0, ttft=1.0, itl=[1.0, 1.0, 1.0], tokens=7),
        # Sent at 2.5 s, chunks at 3 s and 5 s: only its first token falls inside a 4 s window.
        ok(1, ttft=0.5, itl=[2.0], tokens=5, sent_s=2.5),
        # Sent just before the window closed, first chunk after it: nothing inside.
        ok(2, ttft=0.5, itl=[0.5], tokens=2, sent_s=3.9),
        failed(3, "timeout", "no complete response"),
    ]
    report = summarize(outcomes, duration_s=5.0, slo_ms={}, window_s=4.0)
    assert report["window"] == pytest.approx({"s": 4.0, "output_tokens": 8.0, "output_tokens_per_s": 2.0})
    # A window of 2.5 s holds request 0's first two chunks: 1 + 2 tokens.
    assert summarize(outcomes, 5.0, {}, window_s=2.5)["window"]["output_tokens"] == pytest.approx(3.0)
    # The whole run's rate is unchanged by it: all 14 tokens over 5 s.
    assert report["throughput"]["output_tokens_per_s"] == pytest.approx(14 / 5)


def test_a_schedules_window_splits_its_tokens_by_phase():
    outcomes = [
        ok(0, ttft=1.0, itl=[1.0, 1.0, 1.0], tokens=7),  # chunks at 1, 2, 3, 4 s: 1, 2, 2, 2 tokens
        ok(1, ttft=0.5, itl=[2.0], tokens=5, sent_s=2.5),  # chunks at 3 s and 5 s: 1 and 4 tokens
    ]
    phases = [Phase(1, 2.5), Phase(2, 2.5)]
    window = summarize(outcomes, duration_s=5.5, slo_ms={}, window_s=5.0, phases=phases)["window"]
    assert window["output_tokens"] == pytest.approx(12.0)
    # Each phase counts the tokens that streamed within it, whichever phase sent their request.
    assert window["phases"] == [
        pytest.approx({"clients": 1, "start_s": 0.0, "s": 2.5, "output_tokens": 3.0, "output_tokens_per_s": 1.2}),
        pytest.approx({"clients": 2, "start_s": 2.5, "s": 2.5, "output_tokens": 9.0, "output_tokens_per_s": 3.6}),
    ]
    rows = [line.split() for line in table(summary_for_table(window))]
    assert ["2", "clients", "2.5-5", "s", "3.60", "output", "tok/s"] in rows


def summary_for_table(window: dict) -> dict:
    report = summarize([ok(0, ttft=0.1, itl=[0.1], tokens=2)], 1.0, {})
    return report | {"url": "u", "model": "m", "load": {"kind": "clients"}, "window": window}


def test_no_window_for_open_loops_or_runs_that_ended_before_it():
    outcomes = [ok(0, ttft=1.0, itl=[1.0], tokens=3)]
    assert summarize(outcomes, 2.0, {})["window"] is None
    # A request count stopped the run at 2 s, before a 10 s window could close: its rate would count idle time.
    assert summarize(outcomes, 2.0, {}, window_s=10.0)["window"] is None


def test_errors_by_kind_keep_the_last_traceback_line():
    outcomes = [failed(i, "timeout", "no complete response") for i in range(2)]
    outcomes.append(failed(2, "connection", "Traceback ...\n  File x\naiohttp.ClientPayloadError: broken\n"))
    assert errors(outcomes) == {
        "connection": {"count": 1, "example": "aiohttp.ClientPayloadError: broken"},
        "timeout": {"count": 2, "example": "no complete response"},
    }


def test_classify():
    good = RequestFuncOutput(success=True)
    bad = RequestFuncOutput(success=False, error="Traceback\naiohttp.client_exceptions.ServerDisconnectedError: x")
    empty = RequestFuncOutput(success=False, error="Never received a valid chunk to calculate TTFT.")
    assert classify(good, 200, None) is None
    assert classify(RequestFuncOutput(success=False, error="Not Found"), 404, None) == "http_404"
    assert classify(bad, 200, None) == "connection"
    assert classify(RequestFuncOutput(success=False), None, OSError("refused")) == "connection"
    assert classify(empty, 200, None) == "empty_stream"
    assert classify(RequestFuncOutput(success=False, error="odd"), 200, None) == "other"


def test_usage_missing_counts_chunks_and_the_table_renders():
    outcome = ok(0, ttft=0.1, itl=[0.01, 0.01], tokens=0)
    report = summarize([outcome], 1.0, {"e2e": 100})
    assert report["tokens"]["output"] == 3
    lines = table({**report, "url": "u", "model": "m", "load": {"kind": "concurrency"}})
    assert any(line.startswith("TTFT") for line in lines) and any("goodput" in line for line in lines)
