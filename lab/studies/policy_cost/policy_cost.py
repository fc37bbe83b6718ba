"""The policy's own cost per engine step: seconds in choose + observe over the steps' wall time.

Starts one vLLM engine on the tiny trained pair (CPU), runs the same 8 greedy requests x 256 tokens under each
policy in turn and prints one JSON line per policy. A benchmark, not a test: single runs on a shared
machine move by +-20 %; the share is what to read. 256 tokens give each policy about 150 steps; runs of 64
(about 40 steps) showed `adaptive` at 370 us a step against 237-253 us over 150, which points to a one-off
cost after each switch that short runs spread over too few steps.

    .venv/bin/python lab/studies/policy_cost/policy_cost.py [--policies adaptive,goodput,fixed:k=4]
        [--pair trained | --pair perf --size S --agreement 0.6] [--step-log FILE]

With ``--step-log`` the engine logs every step (the log's own writes fall outside the policy's timer), and
``lab/studies/policy_cost/policy_time_replay.py FILE`` times the same policy on the same steps outside the engine.
"""

from __future__ import annotations

import argparse
import json
import tempfile

from specserve.models.arguments import add_perf_options

PROMPTS = ["def f(x):\n    ", "import os\n", "class A:\n    ", "for i in range(10):\n"] * 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", default="adaptive,goodput,fixed:k=4")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--pair", choices=("trained", "perf"), default="trained")
    add_perf_options(parser, size="S", agreement=0.6)
    parser.add_argument("--step-log", default=None, help="append every engine step to this file (JSON lines)")
    args = parser.parse_args()

    from vllm import SamplingParams

    from specserve.models import cached_pair
    from specserve.replicas.config import engine_env
    from specserve.replicas.config.engine_args import EngineSpec, speculative_engine_kwargs
    from specserve.replicas.tools.offline import offline_llm, read_telemetry, set_policy

    options = {"size": args.size, "agreement": args.agreement} if args.pair == "perf" else {}
    pair = cached_pair(args.pair, **options)
    spec = EngineSpec(
        target=str(pair.target),
        draft=str(pair.draft),
        policy="fixed:k=0",
        max_k=4,
        max_num_seqs=8,
        step_log=args.step_log,
    )
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    env = engine_env.engine_env(tempfile.mkdtemp(prefix="specserve-bench-"), num_cpus=2)
    with engine_env.applied(env), offline_llm(**speculative_engine_kwargs(spec)) as llm:
        llm.generate(PROMPTS, params, use_tqdm=False)  # warm-up
        for policy in args.policies.split(","):
            set_policy(llm, policy)
            before = read_telemetry(llm)
            llm.generate(PROMPTS, params, use_tqdm=False)
            after = read_telemetry(llm, since_step=before.speculation.num_steps)
            steps = after.speculation.num_steps - before.speculation.num_steps
            step_s = sum(after.step_durations_s)
            policy_s = after.speculation.policy_s - before.speculation.policy_s
            policy_cpu_s = after.speculation.policy_cpu_s - before.speculation.policy_cpu_s
            row = {
                "policy": policy,
                "pair": args.pair if args.pair == "trained" else f"perf-{args.size}-a{args.agreement}",
                "steps": steps,
                "mean_step_ms": round(1e3 * step_s / steps, 3),
                "policy_us_per_step": round(1e6 * policy_s / steps, 1),
                "policy_share_of_step_time": round(policy_s / step_s, 4),
                # CPU time on the EngineCore's thread: the rest of the wall time, other threads held the core.
                "policy_cpu_us_per_step": round(1e6 * policy_cpu_s / steps, 1),
            }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
