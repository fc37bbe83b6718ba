"""A policy in control with the simulator's oracle beside it, pricing the same steps with the truth: where the two
pick different k, is it the policy's expected tokens or its step seconds that differ from the truth's?

    PYTHONPATH=$PWD .venv/bin/python lab/studies/oracle_gap/beside_oracle.py [--scenario mixed-ngram-h100-8b]
        [--rate 16] [--policy adaptive] [--seed 0] [--window 60]

The scenario runs as the leaderboard's static cell at ``--rate`` (one ``--window`` s Poisson run). On every pure
decode step (no prompt tokens) the policy chooses as it would alone, and the oracle (``specserve/sim/oracle.py``)
prices every k from the replica's batch. Prints: the steps per (ours, oracle's) k with the truth's goodput lost by
ours, and per k the median of ours over the truth for the batch's expected tokens (from the policy's per-position
acceptance) and the decode seconds (from its step-cost fit). Policies with both (``adaptive``, ``goodput``) only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from lab.experiments.leaderboard import at_static_rate
from specserve.sim import Simulator, load_scenario, resolve, summarize
from specserve.sim.oracle import OracleParams, OraclePolicy, Truth
from specserve.speculation import Decision, EngineTraits, Policy, StepContext, make_policy
from specserve.speculation.estimators.acceptance import expected_tokens_upto


@dataclass
class Beside:
    """Per pure decode step: batch size, our k, the truth's goodput per k, ours over the truth per k for tokens
    and decode seconds."""

    ours_k: list[int] = field(default_factory=list)
    truth_goodputs: list[np.ndarray] = field(default_factory=list)
    tokens_ratio: list[np.ndarray] = field(default_factory=list)
    seconds_ratio: list[np.ndarray] = field(default_factory=list)


def run(scenario_name: str, rate_qps: float, spec: str, seed: int, window_s: float = 60.0) -> tuple[Beside, dict]:
    scenario = at_static_rate(load_scenario(scenario_name), rate_qps, window_s)
    seen = Beside()

    def build(traits: EngineTraits, truth: Truth) -> Policy:
        policy = make_policy(spec, traits)
        oracle = OraclePolicy(OracleParams(), traits, truth)
        if not hasattr(policy, "core") or not hasattr(policy, "decode_seconds_all"):
            raise SystemExit(f"--policy {spec!r}: needs a policy with an acceptance estimate and a step-cost fit")
        choose = policy.choose

        def beside(ctx: StepContext) -> Decision:
            decision = choose(ctx)
            prices = oracle.price() if ctx.draft_resident and not ctx.num_prefill_tokens else None
            if prices is not None:
                goodputs = oracle.goodputs()
                assert goodputs is not None
                ks = len(goodputs) - 1
                ours_tokens = ctx.num_running * np.array(expected_tokens_upto(policy.core.acceptance.alphas(), ks))
                seen.ours_k.append(decision.k)
                seen.truth_goodputs.append(goodputs)
                seen.tokens_ratio.append(ours_tokens / prices.decode_tokens)
                seen.seconds_ratio.append(policy.decode_seconds_all(ctx) / prices.decode_s)
            return decision

        policy.choose = beside  # type: ignore[method-assign]
        return policy

    simulator = Simulator(resolve(scenario), spec, seed)
    simulator.build_policy = build
    return seen, summarize(simulator.run())


def report(seen: Beside, summary: dict) -> str:
    lines = [f"mean E2E {summary['mean_e2e_s']:.3f} s, mean k {summary['mean_k']:.2f}, {len(seen.ours_k)} steps"]
    pairs: Counter[tuple[int, int]] = Counter()
    lost: defaultdict[tuple[int, int], float] = defaultdict(float)
    for k, goodputs in zip(seen.ours_k, seen.truth_goodputs, strict=True):
        best = int(np.argmax(goodputs))
        pairs[(k, best)] += 1
        lost[(k, best)] += 1.0 - goodputs[k] / goodputs[best]
    lines.append("ours k  oracle k  steps  truth's goodput lost")
    for (k, best), n in pairs.most_common(10):
        lines.append(f"{k:6d}  {best:8d}  {n:5d}  {lost[(k, best)] / n:.3f}")
    lines.append("k  ours/truth: tokens median [p10, p90]  decode s median")
    tokens, seconds = np.array(seen.tokens_ratio), np.array(seen.seconds_ratio)
    for k in range(tokens.shape[1]):
        t = tokens[:, k]
        lines.append(
            f"{k}  {statistics.median(t):.3f} [{np.percentile(t, 10):.3f}, {np.percentile(t, 90):.3f}]"
            f"  {statistics.median(seconds[:, k]):.3f}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="mixed-ngram-h100-8b")
    parser.add_argument("--rate", type=float, default=16.0, help="the static cell's rate, QPS")
    parser.add_argument("--policy", default="adaptive")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window", type=float, default=60.0, help="seconds of arrivals (the leaderboard's 60)")
    args = parser.parse_args()
    if not args.rate > 0:
        parser.error(f"--rate: {args.rate} is not a positive rate")
    if not args.window > 0:
        parser.error(f"--window: {args.window} is not a positive duration")
    seen, summary = run(args.scenario, args.rate, args.policy, args.seed, args.window)
    if not seen.ours_k:
        print("no pure decode step to compare", file=sys.stderr)
        return 1
    print(report(seen, summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
