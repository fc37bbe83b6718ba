"""Golden trace (house rule 9): the kernel's events, step times and tokens on a seeded run are pinned.

The policies are ``cycle`` (k = 0, 3, 1, 0, 3, 1, ...: a k = 0 step with the draft's sync pass, a drafting step, a
short one) and ``fixed:k=2``, whose choices do not depend on what they observe, so these numbers pin the simulator
(routing, scheduling, verdicts, step prices, token accounting) and nothing of a learning policy; ``adaptive`` is
tested by what it achieves (test_adaptive_ends_near_the_best_fixed_k). Two replicas, so the router is pinned too.

The expected values were derived from the code at the commit before the sim/experiments split (ce411bc) and are
unchanged by it. The first step is a 64-token prefill at k = 0 with the draft's sync pass on the linear
Llama-2-7B + 160m H100 fit: 4.1 ms + 64 * 18 us (target) plus 1.2 ms + 64 * 2 us (draft) = 6.58 ms; the second
decodes one token with k = 3 (three draft passes), 7.79 ms. If a change to the simulator moves these numbers on
purpose, re-derive them and say why in the commit.
"""

from __future__ import annotations

import pytest
from sim_helpers import small_scenario

from specserve.sim import StepStats, simulate, summarize
from specserve.sim.config import RouterConfig
from specserve.speculation import StepRecord

SEED = 11
GOLDEN_EVENTS = [  # (time s, phase, replica, request) of the cycle run
    (0.025690, "ARRIVAL", 0, 0),
    (0.025690, "STEP_START", 0, 0),
    (0.032270, "STEP_END", 0, 0),
    (0.032270, "STEP_START", 0, 0),
    (0.040060, "STEP_END", 0, 0),
    (0.040060, "STEP_START", 0, 0),
    (0.045410, "STEP_END", 0, 0),
    (0.045410, "STEP_START", 0, 0),
    (0.050741, "STEP_END", 0, 0),
    (0.050741, "STEP_START", 0, 0),
    (0.058533, "STEP_END", 0, 0),
    (0.058533, "STEP_START", 0, 0),
    (0.062144, "ARRIVAL", 0, 1),
    (0.062144, "STEP_START", 1, 0),
    (0.063883, "STEP_END", 0, 0),
    (0.063883, "STEP_START", 0, 0),
]
GOLDEN_STEPS = [  # (replica, k, duration ms, batched tokens, draft passes, emitted tokens, accepted drafts)
    (0, 0, 6.5800, 64, 1, 1, 0),
    (0, 3, 7.7904, 4, 3, 3, 2),
    (0, 1, 5.3495, 2, 1, 1, 0),
    (0, 0, 5.3316, 1, 1, 1, 0),
    (0, 3, 7.7913, 4, 3, 2, 1),
    (0, 1, 5.3501, 2, 1, 2, 1),
    (1, 0, 6.5800, 64, 1, 1, 0),
    (0, 0, 5.3325, 1, 1, 1, 0),
    (1, 3, 7.7904, 4, 3, 4, 3),
    (0, 3, 7.7923, 4, 3, 4, 3),
    (1, 1, 5.3496, 2, 1, 2, 1),
    (0, 1, 5.3513, 2, 1, 2, 1),
]
# Whole runs: (end s, steps per replica, output tokens, drafted, accepted, replica of each request).
GOLDEN_RUNS = {
    "cycle:ks=0-3-1": (0.5519536247076499, [50, 53], 192, 153, 84, [0, 1, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1]),
    "fixed:k=2": (0.5410220915447367, [51, 31], 192, 170, 104, [0, 1, 0, 1, 0, 0, 1, 0, 0, 0, 1, 0]),
}


def golden_scenario():
    """Twelve identical requests (64-token prompts, 16 output tokens) at 20 QPS for 0.5 s on two replicas."""
    return small_scenario(
        num_replicas=2,
        workload={
            "arrivals": {"kind": "poisson", "rate_qps": 20, "duration_s": 0.5},
            "lengths": {"prompt_tokens": {"mean": 64, "std": 0}, "output_tokens": {"mean": 16, "std": 0}},
        },
    )


def test_golden_events_and_steps() -> None:
    steps: list[tuple[StepRecord, StepStats]] = []
    result = simulate(
        golden_scenario(),
        "cycle:ks=0-3-1",
        SEED,
        on_step=lambda r, s: steps.append((r, s)),
        max_trace_events=len(GOLDEN_EVENTS),
    )
    events = [(e.time_s, e.phase, e.replica, e.request) for e in result.trace]
    assert [e[1:] for e in events] == [g[1:] for g in GOLDEN_EVENTS]
    assert [e[0] for e in events] == pytest.approx([g[0] for g in GOLDEN_EVENTS], abs=1e-6)
    got = [
        (
            s.replica,
            r.k,
            1e3 * r.duration_s,
            r.num_batched_tokens,
            r.num_draft_passes,
            r.num_emitted_tokens,
            r.num_accepted,
        )
        for r, s in steps[: len(GOLDEN_STEPS)]
    ]
    assert [g[:2] + g[3:] for g in got] == [g[:2] + g[3:] for g in GOLDEN_STEPS]
    assert [g[2] for g in got] == pytest.approx([g[2] for g in GOLDEN_STEPS], abs=1e-4)


@pytest.mark.parametrize("policy", sorted(GOLDEN_RUNS))
def test_golden_runs(policy: str) -> None:
    end_s, steps, tokens, drafted, accepted, routed = GOLDEN_RUNS[policy]
    result = simulate(golden_scenario(), policy, SEED)
    assert result.end_s == pytest.approx(end_s, rel=1e-12)
    assert [len(r.series_k) for r in result.replicas] == steps
    assert int(result.table.num_output.sum()) == tokens == summarize(result)["num_requests"] * 16
    assert (sum(r.num_drafted for r in result.replicas), sum(r.num_accepted for r in result.replicas)) == (
        drafted,
        accepted,
    )
    assert result.table.replica.tolist() == routed


def test_the_default_router_is_least_outstanding_and_pinned() -> None:
    """Naming the default router (routing.py) changes nothing: the same routes, end and tokens as the golden run."""
    end_s, steps, tokens, drafted, accepted, routed = GOLDEN_RUNS["fixed:k=2"]
    scenario = golden_scenario()
    assert scenario.router.kind == "least_outstanding"
    result = simulate(scenario.model_copy(update={"router": RouterConfig(kind="least_outstanding")}), "fixed:k=2", SEED)
    assert result.end_s == pytest.approx(end_s, rel=1e-12)
    assert [len(r.series_k) for r in result.replicas] == steps
    assert result.table.replica.tolist() == routed
    assert result.router is not None and sum(result.router.counts.values()) == len(routed)


def test_event_order_is_time_then_phase_then_insertion() -> None:
    from specserve.sim.events import EventQueue, Phase

    queue = EventQueue()
    queue.push(1.0, Phase.STEP_START, replica=1)
    queue.push(1.0, Phase.ARRIVAL, request=5)
    queue.push(1.0, Phase.STEP_END, replica=2)
    queue.push(0.5, Phase.STEP_START, replica=3)
    queue.push(1.0, Phase.ARRIVAL, request=6)
    order = [queue.pop() for _ in range(5)]
    assert [(e.time_s, e.phase, e.replica, e.request) for e in order] == [
        (0.5, Phase.STEP_START, 3, 0),
        (1.0, Phase.STEP_END, 2, 0),
        (1.0, Phase.ARRIVAL, 0, 5),
        (1.0, Phase.ARRIVAL, 0, 6),
        (1.0, Phase.STEP_START, 1, 0),
    ]
