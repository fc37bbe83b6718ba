"""Does rebuilding the draft hold the engine's interpreter? The draft's rebuild (``draft_memory.DraftLoader``) runs
on a thread beside the engine's steps; while a C call holds Python's GIL, the step loop cannot run its Python.

    PYTHONPATH=$PWD .venv/bin/python lab/studies/draft_memory/reload_build_gil.py \
        [--size S] [--dtype float32] [--rounds 3] [--out FILE]

One engine in this process (no EngineCore process, so its worker is reachable), perf pair S. Each round drops the
draft and rebuilds it on the loader's thread while a ticker thread sleeps 1 ms at a time and records how late it
wakes: a wait longer than a few ms is the build holding the GIL. vLLM's loader phases (model construction, weight
loading, post-processing into oneDNN handlers) are timed by wrapping them. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from typing import Any

from lab.experiments.report_io import emit_report
from specserve.models.arguments import add_perf_options


def wrap_phases(phases: list[tuple[str, float, float]]) -> None:
    from vllm.model_executor.model_loader import base_loader, default_loader

    def timed(owner: Any, name: str) -> None:
        original = getattr(owner, name)

        def run(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                phases.append((name, started, time.perf_counter()))

        setattr(owner, name, run)

    timed(base_loader.BaseModelLoader, "create_model")
    timed(default_loader.DefaultModelLoader, "load_weights")
    timed(base_loader, "process_weights_after_loading")


def one_round(runner: Any, phases: list[tuple[str, float, float]]) -> dict[str, Any]:
    from specserve.replicas.draft_memory import worker as draft_memory

    draft_memory.drop_draft(runner)
    wakes: list[tuple[float, float]] = []
    stop = threading.Event()

    def tick() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            wakes.append((last, now))
            last = now

    ticker = threading.Thread(target=tick)
    ticker.start()
    phases.clear()
    started = time.perf_counter()
    loader = draft_memory.begin_restore(runner)
    while loader.state == "loading":
        time.sleep(0.01)
    built_s = time.perf_counter() - started
    stop.set()
    ticker.join()
    loader.adopt()
    waits = sorted((b - a for a, b in wakes if a >= started), reverse=True)
    return {
        "build_s": built_s,
        "phases_s": {name: end - begin for name, begin, end in phases},
        # The ticker asks for 1 ms; what it waited beyond that, longest first.
        "longest_ticker_waits_s": [w - 0.001 for w in waits[:5]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_perf_options(parser, size="S", agreement=0.6)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the worker in this process

    from vllm import SamplingParams

    from specserve.models import cached_pair
    from specserve.replicas.config import engine_env
    from specserve.replicas.config.engine_args import EngineSpec, speculative_engine_kwargs
    from specserve.replicas.tools import offline

    pair = cached_pair("perf", size=args.size, agreement=args.agreement)
    spec = EngineSpec(
        target=str(pair.target), draft=str(pair.draft), policy="fixed:k=4", max_k=4, max_num_seqs=16, dtype=args.dtype
    )
    phases: list[tuple[str, float, float]] = []
    rounds = []
    with engine_env.applied(engine_env.engine_env(tempfile.mkdtemp(prefix="specserve-reload-gil-"))):
        with offline.offline_llm(**speculative_engine_kwargs(spec)) as llm:
            llm.generate(["warm up"] * 4, SamplingParams(max_tokens=8, temperature=0.0))
            runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
            wrap_phases(phases)
            for i in range(args.rounds):
                rounds.append(one_round(runner, phases))
                print(f"round {i + 1}/{args.rounds}: {rounds[-1]['build_s']:.3f} s", file=sys.stderr)
    report = {
        "what": "the draft's rebuild on its thread: its phases, and how long a 1 ms ticker thread waited for the GIL",
        "pair": {"kind": "perf", "size": args.size, "agreement": args.agreement},
        "dtype": args.dtype,
        "rounds": rounds,
        "longest_ticker_wait_s": max(r["longest_ticker_waits_s"][0] for r in rounds),
    }
    emit_report(report, args.out)


if __name__ == "__main__":
    main()
