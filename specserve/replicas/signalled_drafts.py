"""What a worker hands the scheduler beyond vLLM's outputs: the draft token ids with the draft's signals per token
(see ``draft_signals``), and a step's parts timed (see ``step_timing``).

Its own module, light to import: the EngineCore process unpickles it under the multiprocess executor without
loading the worker's model runner."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm.v1.outputs import DraftTokenIds


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
