"""What crosses between the scheduler and the workers beyond vLLM's own fields: to the workers, the step's draft-pass
plan (``DraftPassPlan``) on its ``SchedulerOutput``; back, the draft token ids with the draft's signals per token
(see ``worker/draft_signals``) and a step's parts timed (see ``worker/step_timing``) on its ``ModelRunnerOutput``.

Both ride as attributes of vLLM's dataclasses (vLLM 0.32.0; neither has ``__slots__``), which reach the other side
whole under every executor: the same object under the uniprocess one; pickled with the instance's ``__dict__`` under
the multiprocess one (``MultiprocExecutor.collective_rpc`` -> ``shm_broadcast.MessageQueue.enqueue``, one message every
tensor-parallel rank reads) and under Ray's (``RayDistributedExecutor`` sends the ``SchedulerOutput`` through its
compiled graph's channels, which pickle it; ``ray_executor_v2`` through the same ``MessageQueue``).

Its own module, light to import: the EngineCore process unpickles it under the multiprocess executor without
loading the worker's model runner."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm.v1.outputs import DraftTokenIds

from specserve.speculation.draft_sync import DraftPassPlan


@dataclass
class SignalledDraftTokenIds(DraftTokenIds):
    """vLLM's draft token ids with, aligned to them, the draft's confidence (its probability of the token it
    drafted) and the entropy of its distribution in nats, per drafted token."""

    confidences: list[list[float]] = field(default_factory=list)
    entropies: list[list[float]] = field(default_factory=list)


# On a step's ModelRunnerOutput, set by the worker (step_timing.py): (target pass seconds, draft passes seconds).
TIMINGS_ATTR = "specserve_timings"


def step_timings(output: Any) -> tuple[float, float] | None:
    """(target pass seconds, draft passes seconds) of the step ``output`` came from; None where not measured."""
    timings = getattr(output, TIMINGS_ATTR, None)
    return (float(timings[0]), float(timings[1])) if timings is not None else None


# On a step's SchedulerOutput, set by the scheduler (core/scheduler.py): the step's ``DraftPassPlan``.
PLAN_ATTR = "specserve_draft_pass_plan"
# A step the scheduler planned nothing for (not specserve's scheduler, or a step with no tokens): vLLM's own pass.
UNPLANNED = DraftPassPlan()


def attach_plan(output: Any, plan: DraftPassPlan) -> None:
    setattr(output, PLAN_ATTR, plan)


def step_plan(output: Any) -> DraftPassPlan:
    """The plan the scheduler attached to ``output``; ``UNPLANNED`` where it attached none."""
    plan: DraftPassPlan = getattr(output, PLAN_ATTR, UNPLANNED)
    return plan
