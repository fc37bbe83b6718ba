"""Replay a trace into an in-process engine in real time and keep its step log (the engine half of the
simulator-vs-engine check, ``bench/engine_check.py``; the simulator half is ``experiments/engine_check.py``).

Each request is added once its arrival time has passed (random prompt token ids of the trace's length,
greedy, ``ignore_eos``, ``max_tokens`` = the trace's output length). The engine keeps a bounded ring of step
records, so the log is collected as the run goes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from specserve.replicas import offline

# Steps between two collections of the engine's step log; far below its ring's size.
COLLECT_EVERY = 512


def replay(
    llm: Any, rows: Sequence[tuple[float, int, int]], policy: str, vocab: int, warm_start: bool = True
) -> tuple[list[dict], float, list[float]]:
    """``rows`` are (arrival_s, prompt_tokens, output_tokens), by arrival. Returns the run's step log (each
    entry with ``t_s`` from the first step), the makespan from the start and each request's end-to-end
    seconds from its arrival. ``warm_start`` as in ``offline.set_policy``."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    offline.set_policy(llm, policy, warm_start)
    # Every run sends the same prompts (the same seed): none may find another run's prefill in the cache.
    llm.reset_prefix_cache()
    cursor = offline.read_telemetry(llm).num_steps
    engine = llm.llm_engine
    rng = np.random.default_rng(0)
    pending = list(enumerate(rows))
    log: list[dict] = []
    e2e: list[float] = []
    steps = 0
    started = time.monotonic()
    while pending or engine.has_unfinished_requests():
        now = time.monotonic() - started
        while pending and pending[0][1][0] <= now:
            i, (_, prompt_tokens, output_tokens) = pending.pop(0)
            ids = rng.integers(3, vocab, size=prompt_tokens).tolist()
            params = SamplingParams(temperature=0.0, max_tokens=output_tokens, ignore_eos=True)
            engine.add_request(f"replay-{i}", TokensPrompt(prompt_token_ids=ids), params)
        if engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    index = int(out.request_id.removeprefix("replay-"))
                    e2e.append(time.monotonic() - started - rows[index][0])
            steps += 1
            if steps % COLLECT_EVERY == 0:
                cursor = _collect(llm, log, cursor)
        elif pending:
            time.sleep(min(0.05, max(0.0, pending[0][1][0] - now)))
    makespan = time.monotonic() - started
    _collect(llm, log, cursor)
    for entry in log:
        entry["t_s"] = entry["now_s"] - (log[0]["now_s"] if log else 0.0)
    return log, makespan, e2e


def _collect(llm: Any, log: list[dict], cursor: int) -> int:
    new = offline.read_step_log(llm, cursor)
    log.extend(new)
    return cursor + len(new)
