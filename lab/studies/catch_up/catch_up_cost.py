"""What resuming speculation costs: the draft's catch-up over the tokens it skipped at k = 0, against batch
size and lag (the tiny trained pair, CPU, one engine).

    PYTHONPATH=$PWD .venv/bin/python lab/studies/catch_up/catch_up_cost.py \
        [--rounds 3] [--out specserve/replicas/catch_up_cpu.json]

For each batch B and lag L, B requests decode at k = 0 for L + 1 steps (L positions left unwritten), then
at k = 4 for 8 steps. The worker times every call of the drafter's propose (``draft_skip``); the catch-up's
cost is the propose time of the step that caught up, minus the median propose time of the k = 4 steps after
it that caught nothing up, at the same B. The JSON keeps every point and a least-squares fit
seconds = s_per_token * B * L + intercept_s, the profile ``EngineTraits.resume_s_per_token`` reads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from specserve.models.prompts import OPENINGS

PROMPTS = list(OPENINGS)
BATCHES = (1, 4, 8)
LAGS = (4, 16, 64)
AFTER_STEPS = 8


def measure(llm, batch: int, lag: int) -> float | None:
    """Seconds the catch-up added to one pass, or None if no step caught up (it must: the budget has room)."""
    from vllm import SamplingParams

    from specserve.replicas.tools import offline

    engine = llm.llm_engine
    # Long enough that no request ends inside the measured steps, even accepting every draft.
    params = SamplingParams(temperature=0.0, max_tokens=lag + 8 + 5 * AFTER_STEPS, ignore_eos=True)
    offline.set_policy(llm, "fixed:k=0")
    for i, prompt in enumerate(PROMPTS[:batch]):
        engine.add_request(f"r{batch}-{lag}-{i}", prompt, params)
    # step() blocks while no request is unfinished, so every call is guarded.
    while engine.has_unfinished_requests() and not any(engine.step()):
        pass  # the prefill (it runs the draft pass)
    llm.collective_rpc("specserve_propose_times")  # forget the prefill's pass
    for _ in range(lag + 1):
        engine.step()
    offline.set_policy(llm, "fixed:k=4")
    while engine.has_unfinished_requests():
        engine.step()
    (times,) = llm.collective_rpc("specserve_propose_times")
    full = [(n, tokens, s) for n, tokens, s in times if n == batch]
    caught = [s for _, tokens, s in full if tokens > 0]
    plain = [s for _, tokens, s in full if tokens == 0]
    if not caught or not plain:
        return None
    return caught[0] - statistics.median(plain)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    # The engine reads its resume cost from here (replicas/k0_skip.resume_cost).
    parser.add_argument("--out", type=Path, default=Path("specserve/replicas/catch_up_cpu.json"))
    args = parser.parse_args()
    from specserve.models import cached_pair
    from specserve.replicas.config import engine_env
    from specserve.replicas.config.engine_args import EngineSpec, speculative_engine_kwargs
    from specserve.replicas.tools import offline

    pair = cached_pair("trained")
    kwargs = speculative_engine_kwargs(
        EngineSpec(target=str(pair.target), draft=str(pair.draft), policy="fixed:k=0", max_k=4, max_num_seqs=8)
    )
    points: dict[tuple[int, int], list[float]] = {}
    scratch = tempfile.mkdtemp(prefix="specserve-catch-up-bench-")
    with engine_env.applied(engine_env.engine_env(scratch)), offline.offline_llm(**kwargs) as llm:
        measure(llm, 1, 4)  # warm-up
        for round_ in range(args.rounds):
            for batch in BATCHES:
                for lag in LAGS:
                    cost = measure(llm, batch, lag)
                    if cost is not None:
                        points.setdefault((batch, lag), []).append(cost)
                    print(f"round {round_ + 1}/{args.rounds} B={batch} L={lag}: {cost}", file=sys.stderr)
    rows = [
        {"batch": b, "lag": lag, "tokens": b * lag, "seconds": statistics.median(v), "rounds": v}
        for (b, lag), v in sorted(points.items())
    ]
    x = np.array([[r["tokens"], 1.0] for r in rows])
    y = np.array([r["seconds"] for r in rows])
    (slope, intercept), *_ = np.linalg.lstsq(x, y, rcond=None)
    result = {
        "command": "PYTHONPATH=$PWD .venv/bin/python lab/studies/catch_up/catch_up_cost.py",
        "pair": "trained (tiny, CPU, bf16, eager)",
        "points": rows,
        "fit": {"s_per_token": max(float(slope), 0.0), "intercept_s": float(intercept)},
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["fit"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
