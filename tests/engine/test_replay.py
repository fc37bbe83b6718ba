"""The engine half of the simulator-vs-engine check: a trace and a closed loop of clients driven into a real
engine in real time (``lab.harness.replay``), on the tiny trained pair."""

from __future__ import annotations

from lab.harness.replay import replay, replay_clients
from specserve.sim.config import ClientPhase
from specserve.sim.workload import clients_at

OUTPUT_TOKENS = 24


def vocab(llm) -> int:
    return len(llm.get_tokenizer())


def test_a_closed_loop_keeps_each_client_busy_and_sends_nothing_after_its_phases(shared_engine):
    phases = [ClientPhase(clients=1, duration_s=1.5), ClientPhase(clients=3, duration_s=1.5)]
    llm = shared_engine.llm
    log, makespan, e2e = replay_clients(llm, lambda t: clients_at(phases, t), 8, OUTPUT_TOKENS, "fixed:k=2", vocab(llm))
    horizon = sum(p.duration_s for p in phases)
    decodes = [e for e in log if e["num_running"] > 0]
    # One client alone never has two requests in flight; three never more than three, and all three at once.
    assert max(e["num_running"] for e in decodes if e["t_s"] < phases[0].duration_s - 0.1) == 1
    assert max(e["num_running"] for e in decodes) == 3
    assert max(e["num_running"] for e in decodes if e["t_s"] > phases[0].duration_s + 0.5) == 3
    # Every request sent was answered in full, and the run ended with the last of them, not before.
    # The step log counts the sampler's tokens, as vLLM does: a last step may run up to k past max_tokens.
    emitted = sum(e["num_emitted_tokens"] for e in log)
    assert OUTPUT_TOKENS * len(e2e) <= emitted <= (OUTPUT_TOKENS + 2) * len(e2e)
    assert len(e2e) > 3 and all(t > 0 for t in e2e)
    assert horizon <= makespan < horizon + max(e2e) + 1.0
    # Each step's parts, as engine_check fits them: the target's pass inside the step, the draft's two passes
    # timed on every step that ran them.
    assert all(0 < e["forward_s"] < e["duration_s"] for e in log)
    assert all(e["draft_s"] > 0 for e in log if e["num_draft_passes"] > 0)


def test_a_trace_adds_each_request_at_its_arrival(shared_engine):
    rows = [(0.0, 8, OUTPUT_TOKENS), (0.6, 8, OUTPUT_TOKENS), (0.6, 8, OUTPUT_TOKENS), (1.2, 8, OUTPUT_TOKENS)]
    llm = shared_engine.llm
    log, makespan, e2e = replay(llm, rows, "fixed:k=0", vocab(llm))
    assert len(e2e) == len(rows)
    assert sum(e["num_emitted_tokens"] for e in log) == OUTPUT_TOKENS * len(rows)
    assert makespan >= rows[-1][0]
    assert {e["k"] for e in log} == {0}
