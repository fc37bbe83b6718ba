"""Slow tier (`make test-slow`): the soak. One `specserve serve` under closed-loop clients whose number changes
every phase, mixing streaming and plain chat and completions, while the policy is switched every few minutes.

    SPECSERVE_SOAK_S=600 (the default; the figure in docs/user-guide/reliability.md) SPECSERVE_SOAK_OUT=bench/results \
        .venv/bin/python -m pytest -q -m slow tests/serve/test_soak.py

Expectations: every request answered 200 (no 5xx, no client error, no hang); every process's memory bounded
(mean RSS over the last fifth within 10 % + 32 MiB of its mean over the fifth after warm-up); the engine's
token counters equal what the clients were told (usage), request for request. Writes soak.json and soak.png.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from serve_process import free_port, serving
from soak import RssSampler, ScheduledLoad, plot, settled_totals, write_json

pytestmark = pytest.mark.slow

DURATION_S = float(os.environ.get("SPECSERVE_SOAK_S", "600"))
LEVELS = (2, 6, 1, 8, 4, 3)  # active clients per phase; 8 = the engine's max_num_seqs
PHASE_S = 45.0
# Engine policies with their defaults; switched in this order, one every SWITCH_S, cycled.
POLICIES = ("fixed:k=3", "goodput", "fixed:k=0", "static-table", "bandit", "ucb", "adaptive")
SWITCH_S = 70.0
COUNTERS = (
    "ray_vllm_generation_tokens_total",
    "ray_vllm_prompt_tokens_total",
    "ray_vllm_request_success_total",
    "ray_specserve_emitted_tokens_total",
)
# A priori, not fitted: a process whose memory grows by more than this in ten minutes of steady serving leaks.
RSS_GROWTH_FRACTION, RSS_GROWTH_BYTES = 0.10, 32 * 2**20


@pytest.fixture(scope="module")
def server(tmp_path_factory, trained_pair):
    args = ["--port", str(free_port()), "--metrics-port", str(free_port()), "--max-k", "4"]
    with serving(args, tmp_path_factory.mktemp("soak")) as process:
        process.metrics_url = process.line_matching(r"metrics: ").split()[1]
        yield process


def set_policy(server, spec: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "specserve", "policy", "set", spec],
        env=server.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"policy set {spec}: {done.stderr}"


def rss_growth(rss: RssSampler, duration_s: float) -> list[dict]:
    """Per process alive through the soak: mean RSS over the fifth after warm-up and over the last fifth."""
    rows = []
    for pid, (name, points) in rss.by_process().items():
        early = [v for t, v in points if duration_s * 0.2 <= t < duration_s * 0.4]
        late = [v for t, v in points if t >= duration_s * 0.8]
        if early and late:
            before, after = sum(early) / len(early), sum(late) / len(late)
            rows.append({"pid": pid, "name": name, "early_mib": before / 2**20, "late_mib": after / 2**20})
    return rows


def test_soak_answers_every_request_with_bounded_memory_and_consistent_token_counts(server, tmp_path):
    out = Path(os.environ.get("SPECSERVE_SOAK_OUT", tmp_path))
    before = settled_totals(server.metrics_url, COUNTERS)
    switches: list[tuple[float, str]] = []
    root = psutil.Process(server.proc.pid)
    with RssSampler(root) as rss, ScheduledLoad(server.endpoint, LEVELS, PHASE_S) as load:
        next_switch = SWITCH_S
        while load.now() < DURATION_S:
            if load.now() >= next_switch:
                spec = POLICIES[len(switches) % len(POLICIES)]
                set_policy(server, spec)
                switches.append((load.now(), spec))
                next_switch += SWITCH_S
            time.sleep(1.0)
    after = settled_totals(server.metrics_url, COUNTERS)
    delta = {name: after[name] - before[name] for name in COUNTERS}
    answered = [r for r in load.requests if r.status == 200 and not r.detail]
    failed = [r for r in load.requests if r not in answered]
    growth = rss_growth(rss, DURATION_S)
    summary = {
        "duration_s": DURATION_S,
        "levels": LEVELS,
        "phase_s": PHASE_S,
        "policy_switches": switches,
        "requests": len(load.requests),
        "answered": len(answered),
        "failed": len(failed),
        "by_kind": {
            k: sum(r.kind == k for r in answered) for k in ("completions", "completions-stream", "chat-stream")
        },
        "completion_tokens_received": sum(r.completion_tokens for r in answered),
        "prompt_tokens_received": sum(r.prompt_tokens for r in answered),
        "engine_counters": delta,
        "processes_sampled": len(rss.by_process()),
        "rss_growth": growth,
        "p99_latency_s": sorted(r.end_s - r.start_s for r in answered)[int(0.99 * (len(answered) - 1))],
    }
    print(f"\nsoak: {summary | {'rss_growth': len(growth)}}")
    write_json(out / "soak.json", summary, load, rss)
    plot(out / "soak.png", load, rss, switches)

    assert not failed, f"{len(failed)} of {len(load.requests)} requests failed, e.g. {failed[:3]}"
    assert len(switches) == int((DURATION_S - 1e-9) // SWITCH_S)
    assert delta["ray_vllm_request_success_total"] == len(answered)
    assert delta["ray_vllm_generation_tokens_total"] == summary["completion_tokens_received"]
    assert delta["ray_vllm_prompt_tokens_total"] == summary["prompt_tokens_received"]
    # Engine steps may sample past a request's max_tokens; the frontend drops those, never adds.
    assert delta["ray_specserve_emitted_tokens_total"] >= summary["completion_tokens_received"]
    leaking = [
        row
        for row in growth
        if (row["late_mib"] - row["early_mib"]) * 2**20
        > RSS_GROWTH_FRACTION * row["early_mib"] * 2**20 + RSS_GROWTH_BYTES
    ]
    assert growth and not leaking, f"memory grew past the budget: {leaking}"
