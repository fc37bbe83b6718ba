"""The simulator announces prefill as the vLLM scheduler does (both call speculation.context)."""

from __future__ import annotations

from sim_helpers import small_scenario

from specserve.sim import simulate
from specserve.speculation import make_policy


def run_logged(scenario, policy):
    steps = []
    result = simulate(scenario, policy, 0, on_step=lambda record, stats: steps.append((record, stats)))
    return result, steps


def test_an_offline_batch_announces_each_prompt_once() -> None:
    # Requests arrive at once for two seats. A waiting prompt may be announced only on the step that admits
    # it, so the announced prefill over the run adds up to the prompts, as on the real engine
    # (tests/engine/test_step_context.py). Counting the whole queue would announce it on every step.
    contexts = []

    def recording(traits):
        policy = make_policy("fixed:k=0", traits)
        choose = policy.choose
        policy.choose = lambda ctx: contexts.append(ctx) or choose(ctx)
        return policy

    scenario = small_scenario(
        engine={"max_num_seqs": 2, "max_k": 4},
        workload={"arrivals": {"kind": "poisson", "rate_qps": 100_000, "duration_s": 1e-4}},
    )
    result, steps = run_logged(scenario, recording)
    prompts = int(result.table.prompt_tokens.sum())
    assert len(result.table.prompt_tokens) >= 4
    assert max(ctx.num_waiting for ctx in contexts) >= 2
    assert sum(stats.num_preempted for _, stats in steps) == 0
    assert sum(ctx.num_prefill_tokens for ctx in contexts) == prompts
    full = [ctx for ctx in contexts if ctx.num_running == 2]
    assert full and all(ctx.num_prefill_tokens == 0 for ctx in full)
