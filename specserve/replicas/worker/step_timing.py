"""Worker side of a step's parts: seconds in the target's pass and in the draft's passes (vLLM 0.32.0).

A policy that fits a step's cost on whole steps cannot tell, while it runs one k, which part of a step grows with
k: the draft's passes and the target's verified tokens move with the batch exactly as the per-step and
per-request costs do. Timing the parts where they run gives the fit each part on its own at any k
(``estimators.step_latency.StepLatencyModel``). The worker times its ``execute_model`` (the target's inputs,
forward pass and logits) and the drafter's proposals inside ``sample_tokens``, and hands both to the scheduler on
the step's ``ModelRunnerOutput`` as an attribute (``TIMINGS_ATTR``): in the same process under the uniprocess
executor, pickled with it under the multiprocess one (the dataclass keeps its ``__dict__``).

Private vLLM interfaces touched (paths under ``vllm/``, vLLM 0.32.0):

- ``v1/worker/gpu_model_runner.py:3940`` ``GPUModelRunner.execute_model``: wrapped, timed.
- ``v1/worker/gpu_model_runner.py:4304`` ``GPUModelRunner.sample_tokens``: wrapped; under synchronous scheduling
  it returns a fresh ``ModelRunnerOutput`` (4519), which the wrapper annotates; an ``AsyncModelRunnerOutput``
  or the shared ``EMPTY_MODEL_RUNNER_OUTPUT`` is left alone (the scheduler then has no parts for that step).
- ``v1/outputs.py:267`` ``ModelRunnerOutput``: a plain dataclass; one attribute added to an instance.
"""

from __future__ import annotations

import time
from typing import Any

from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from specserve.replicas import vllm_hooks
from specserve.replicas.signalled_drafts import TIMINGS_ATTR

TARGETS = (
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model",
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner.sample_tokens",
)

# The step under way on this worker: its execute_model's seconds and the draft's seconds so far.
_step = {"forward_s": 0.0, "draft_s": 0.0}

# vLLM's methods, kept by ``install``.
_original_execute: Any = None
_original_sample: Any = None


def add_draft_seconds(seconds: float) -> None:
    """The drafter ran this long in the step under way (extension.py times its calls)."""
    _step["draft_s"] += seconds


def _timed_execute(self: GPUModelRunner, *args: Any, **kwargs: Any) -> Any:
    started = time.perf_counter()
    try:
        return _original_execute(self, *args, **kwargs)
    finally:
        _step["forward_s"], _step["draft_s"] = time.perf_counter() - started, 0.0


def _timed_sample(self: GPUModelRunner, *args: Any, **kwargs: Any) -> Any:
    output = _original_sample(self, *args, **kwargs)
    if type(output) is ModelRunnerOutput and output is not EMPTY_MODEL_RUNNER_OUTPUT:
        setattr(output, TIMINGS_ATTR, (_step["forward_s"], _step["draft_s"]))
    return output


def install() -> None:
    global _original_execute, _original_sample
    _original_execute = vllm_hooks.replace(TARGETS[0], _timed_execute)
    _original_sample = vllm_hooks.replace(TARGETS[1], _timed_sample)
