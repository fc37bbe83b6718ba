"""Time of a k = 0 decode step: speculative engine skipping the draft pass, not skipping it, and an
engine started without speculation (the tiny trained pair, CPU, bf16, eager).

    PYTHONPATH=$PWD .venv/bin/python lab/studies/k0_step/k0_step.py [--rounds 3] [--reps 5] [--out FILE] [--together]
        [--pair trained | --pair perf --size S --agreement 0.6]

By default one engine runs at a time. Each round starts each engine once (the order rotates between rounds) and
times greedy generation of B prompts (B = 1, 4, 8) at two lengths; a decode step's time is the
difference of the two generation times over the difference in tokens, which takes prefill and
per-call overhead out. Per round and engine the median over ``--reps`` repetitions is kept; the JSON
gives, per engine and B, the median over rounds with min and max, and the ratio to the no-speculation
engine taken within each round (paired) as median, min and max.

``--together`` starts the three engines once and keeps them: each round measures them in turn at each B, a few
seconds apart, where one round of separate starts spans minutes. Their idle workers use 1-2 % of a core once
their queues park (``IDLE_S``). On this machine it did not narrow the spread: a 3 ms step varies within seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from typing import Any

from lab.experiments.report_io import emit_report
from specserve.bench.stats import spread
from specserve.models.arguments import add_perf_options
from specserve.models.prompts import OPENINGS

PROMPTS = list(OPENINGS)
BATCHES = (1, 4, 8)
SHORT, LONG = 16, 80
ENGINES = ("skip", "no_skip", "no_spec")
# vLLM's shared-memory queue reader keeps polling for 1 s after its last read before it parks
# (``distributed/device_communicators/shm_broadcast.py``, ``busy_loop_s``); a little more for margin.
IDLE_S = 1.5


def engine_kwargs(name: str, target: str, draft: str) -> dict[str, Any]:
    from specserve.replicas.config.engine_args import EngineSpec, plain_vllm_kwargs, speculative_engine_kwargs

    spec = EngineSpec(target=target, draft=draft, policy="fixed:k=0", max_k=4, skip_k0_draft_pass=name == "skip")
    return plain_vllm_kwargs(spec, speculative=False) if name == "no_spec" else speculative_engine_kwargs(spec)


def generation_s(llm: Any, batch: int, tokens: int) -> float:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    started = time.perf_counter()
    llm.generate(PROMPTS[:batch], params, use_tqdm=False)
    return time.perf_counter() - started


def step_ms(llm: Any, batch: int, reps: int) -> float:
    """Median over ``reps`` of one decode step's ms at ``batch``, from a short and a long generation."""
    steps = []
    for _ in range(reps):
        short, long = generation_s(llm, batch, SHORT), generation_s(llm, batch, LONG)
        steps.append((long - short) / (LONG - SHORT) * 1000)
    return statistics.median(steps)


def report_skips(name: str, llm: Any) -> None:
    from specserve.replicas.tools import offline

    if name != "no_spec":
        counters = offline.read_telemetry(llm).speculation
        print(
            f"{name}: {counters.num_steps} steps, {counters.num_steps_draft_skipped} draft passes skipped",
            file=sys.stderr,
        )


def time_engine(name: str, target: str, draft: str, reps: int) -> dict[int, float]:
    """Median ms per decode step for each batch size, for one engine start."""
    from specserve.replicas.tools import offline

    with offline.offline_llm(**engine_kwargs(name, target, draft)) as llm:
        generation_s(llm, 8, SHORT)  # warm-up
        per_batch = {batch: step_ms(llm, batch, reps) for batch in BATCHES}
        report_skips(name, llm)
    return per_batch


def time_together(target: str, draft: str, rounds: int, reps: int) -> list[dict[str, dict[int, float]]]:
    """Every engine started once and kept: per round and batch, each engine measured in turn (order rotating),
    seconds rather than minutes apart, so a slow phase of the machine hits the engines of one comparison alike.

    An engine's worker polls its queue for ``IDLE_S`` after its last call before it sleeps; each turn waits that
    out first, or the engine just measured would poll on the cores of the next one.
    """
    from specserve.replicas.tools import offline

    with contextlib.ExitStack() as stack:
        llms = {
            name: stack.enter_context(offline.offline_llm(**engine_kwargs(name, target, draft))) for name in ENGINES
        }
        for llm in llms.values():
            generation_s(llm, 8, SHORT)  # warm-up
        results = []
        for r in range(rounds):
            order = ENGINES[r % 3 :] + ENGINES[: r % 3]
            result: dict[str, dict[int, float]] = {name: {} for name in ENGINES}
            for batch in BATCHES:
                for name in order:
                    time.sleep(IDLE_S)
                    result[name][batch] = step_ms(llms[name], batch, reps)
            print(f"round {r}: {result}", file=sys.stderr)
            results.append(result)
        for name, llm in llms.items():
            report_skips(name, llm)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--pair", choices=("trained", "perf"), default="trained")
    parser.add_argument(
        "--together", action="store_true", help="keep all engines running and alternate them (time_together)"
    )
    add_perf_options(parser, size="S", agreement=0.6)
    args = parser.parse_args()

    from specserve.models import cached_pair
    from specserve.replicas.config import engine_env

    options = {"size": args.size, "agreement": args.agreement} if args.pair == "perf" else {}
    pair = cached_pair(args.pair, **options)
    rounds: list[dict[str, dict[int, float]]] = []
    with engine_env.applied(engine_env.engine_env(tempfile.mkdtemp(prefix="specserve-k0-bench-"))):
        if args.together:
            rounds = time_together(str(pair.target), str(pair.draft), args.rounds, args.reps)
        for r in range(0 if args.together else args.rounds):
            order = ENGINES[r % 3 :] + ENGINES[: r % 3]
            result = {}
            for name in order:
                result[name] = time_engine(name, str(pair.target), str(pair.draft), args.reps)
                print(f"round {r}: {name} {result[name]}", file=sys.stderr)
            rounds.append(result)

    report: dict[str, Any] = {
        "what": "ms per k=0 decode step (greedy, bf16, CPU eager, max_k=4)",
        "engines": "started together, alternated per batch" if args.together else "one started per measurement",
        "pair": {"kind": args.pair, **options},
        "rounds": args.rounds,
        "reps_per_round": args.reps,
        "tokens": [SHORT, LONG],
        "ms_per_step": {name: {str(b): spread([r[name][b] for r in rounds]) for b in BATCHES} for name in ENGINES},
        "ratio_to_no_spec": {
            name: {str(b): spread([r[name][b] / r["no_spec"][b] for r in rounds]) for b in BATCHES}
            for name in ("skip", "no_skip")
        },
        "per_round": [{name: {str(b): round(v, 3) for b, v in r[name].items()} for name in ENGINES} for r in rounds],
    }
    emit_report(report, args.out)


if __name__ == "__main__":
    main()
