"""specserve's EngineCore utility methods and its ``post_step`` wrapper (vLLM 0.32.0), installed by the scheduler.

The utility methods run between two steps in the engine's busy loop, so they are cheap; results cross the process
boundary as plain dicts and strings. Callers name them through ``engine_args.Utility``, the one list of their names.

Private vLLM interfaces touched (paths under ``vllm/``, vLLM 0.32.0):

- ``v1/engine/core.py`` ``EngineCore``: the methods of ``UTILITIES`` added (``call_utility`` looks a utility up on the
  core by name, ``EngineCore._handle_client_request``); ``.scheduler``, ``.collective_rpc`` read.
- ``v1/engine/core.py:689`` ``EngineCore.post_step(model_executed)``: wrapped; it fetches the worker's drafts, which a
  skipped draft pass leaves empty.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.engine.core import EngineCore

from specserve.messages import MemoryDecision
from specserve.replicas import vllm_hooks
from specserve.replicas.config.engine_args import STEP_LOG_FIELDS, Utility
from specserve.replicas.core.scheduler import AdaptiveKScheduler
from specserve.replicas.draft_memory.elastic_draft import ElasticDraft

TARGETS = ("vllm.v1.engine.core:EngineCore.post_step",)
# vLLM's method, kept by ``install``.
_original_post_step: Any = None


def _scheduler(core: EngineCore) -> AdaptiveKScheduler:
    scheduler = core.scheduler
    if not isinstance(scheduler, AdaptiveKScheduler):
        raise TypeError(f"engine runs {type(scheduler).__name__}, not specserve's AdaptiveKScheduler")
    return scheduler


def _set_policy(self: EngineCore, spec: str, warm_start: bool = True) -> str:
    return _scheduler(self).set_policy(spec, warm_start)


def _seed_acceptance(self: EngineCore, accepted: list[float], reached: list[float]) -> None:
    _scheduler(self).seed_acceptance(accepted, reached)


def _telemetry(self: EngineCore, since_step: int = 0) -> dict[str, Any]:
    scheduler = _scheduler(self)
    if scheduler.elastic is not None:
        scheduler.elastic.poll_reload(self)  # an idle engine runs no step to adopt a rebuilt draft
    return scheduler.telemetry(since_step).to_dict()


def _step_log(self: EngineCore, since_step: int = 0) -> list[dict[str, Any]]:
    """The steps after ``since_step`` as far as the ring buffer reaches: what each ran and how long it took."""
    return [
        {name: getattr(r, name) for name in STEP_LOG_FIELDS}
        for r in _scheduler(self).counters.records_since(since_step)
    ]


def _check_counts(self: EngineCore) -> dict[str, int]:
    return _scheduler(self).check_counts(self)


def _end_calibration(self: EngineCore, spec: str, failed_checks: list[str], since_step: int = 0) -> str:
    return _scheduler(self).end_calibration(spec, failed_checks, since_step)


def _elastic(core: EngineCore) -> ElasticDraft:
    elastic = _scheduler(core).elastic
    if elastic is None:
        raise RuntimeError("this engine does not speculate: it has no draft to offload")
    return elastic


def _offload_draft(self: EngineCore) -> dict[str, Any]:
    _elastic(self).offload(self)
    return _draft_memory(self)


def _reload_draft(self: EngineCore) -> dict[str, Any]:
    _elastic(self).reload(self)
    return _draft_memory(self)


def _memory_directive(self: EngineCore, decision: str) -> None:
    # msgpack carries the decision's value; an unknown word raises ValueError back to the caller.
    _elastic(self).apply_directive(MemoryDecision(decision))


def _memory_coordinated(self: EngineCore, coordinated: bool) -> None:
    _elastic(self).coordinate(coordinated)


def _draft_memory(self: EngineCore) -> dict[str, Any]:
    """The draft's memory state, with the step counts of the same moment (the engine steps on its own)."""
    counters, elastic = _scheduler(self).counters, _elastic(self)
    elastic.poll_reload(self)
    return {
        **elastic.describe(),
        "num_steps": counters.num_steps,
        "num_steps_k0": counters.num_steps_by_k[0],
        "num_steps_draft_skipped": counters.num_steps_draft_skipped,
    }


def _post_step(self: EngineCore, model_executed: bool) -> None:
    scheduler = self.scheduler
    ours = isinstance(scheduler, AdaptiveKScheduler)
    if ours and model_executed and scheduler.last_step_drafted_nothing:
        # The worker skipped the draft pass (the scheduler's plan, worker/extension.py): its drafts are empty, and
        # vLLM's fetch of them (a worker call, then a pass over the batch) would only empty what ``schedule``
        # already emptied. On a 2-3 ms CPU step that round trip was a few percent of a k = 0 step.
        scheduler.forget_draft_signals()
    else:
        _original_post_step(self, model_executed)
    if ours and scheduler.elastic is not None:
        scheduler.elastic.tick(self)
    if ours and scheduler.collapse is not None:
        scheduler.collapse.tick(self)  # after the elastic tick, which adopts a rebuilt draft


#: Each utility's name (``engine_args.Utility``) and the method EngineCore answers it with.
UTILITIES = {
    Utility.SET_POLICY: _set_policy,
    Utility.TELEMETRY: _telemetry,
    Utility.STEP_LOG: _step_log,
    Utility.SEED_ACCEPTANCE: _seed_acceptance,
    Utility.CHECK_COUNTS: _check_counts,
    Utility.END_CALIBRATION: _end_calibration,
    Utility.OFFLOAD_DRAFT: _offload_draft,
    Utility.RELOAD_DRAFT: _reload_draft,
    Utility.DRAFT_MEMORY: _draft_memory,
    Utility.MEMORY_DIRECTIVE: _memory_directive,
    Utility.MEMORY_COORDINATED: _memory_coordinated,
}
#: The attributes ``install`` adds to vLLM's EngineCore (none of them vLLM's).
ADDED = tuple(f"vllm.v1.engine.core:EngineCore.{name}" for name in UTILITIES)


def install() -> None:
    """Give EngineCore specserve's utility methods and wrap its ``post_step``; once per process."""
    global _original_post_step
    for name, method in UTILITIES.items():
        vllm_hooks.add(EngineCore, name, method)
    _original_post_step = vllm_hooks.replace(TARGETS[0], _post_step)
