"""Which code path the engine runs, checked at start instead of assumed (vLLM 0.32.0).

specserve's per-step k control needs vLLM's V1 model runner with synchronous scheduling: there the draft-model
proposer drafts as many tokens as the scheduler asks (none at k = 0, where the worker extension skips its pass),
and EngineCore hands the scheduler each step's drafts. On a GPU vLLM would pick otherwise by default:

- Model Runner V2 wherever Triton works (``VllmConfig.use_v2_model_runner``, ``vllm/config/vllm.py:702``), whose
  draft-model speculator runs every draft step whatever k is asked and only blanks the columns past k afterwards;
- async scheduling for draft models, under which EngineCore never hands draft ids to the scheduler
  (``vllm/v1/engine/core.py:690``) and the k = 0 skip is off (``k0_skip.skipping_enabled``).

``speculative_llm_config`` sets ``VLLM_USE_V2_MODEL_RUNNER=0`` and ``async_scheduling: false`` on GPU engines; this
check makes an engine that ended up elsewhere anyway (a variable set on the node, a feature that forces Model Runner
V2, such as watermarking) refuse to start with the reason, rather than serve with a k control that does nothing.

Private vLLM interfaces read: ``VllmConfig.use_v2_model_runner``, ``VllmConfig.scheduler_config.async_scheduling``,
``VllmConfig.speculative_config``.
"""

from __future__ import annotations

from typing import Any

#: What the start-up message calls the one path specserve runs.
ENGINE_PATH = "vLLM's V1 model runner with synchronous scheduling (VLLM_USE_V2_MODEL_RUNNER=0, async_scheduling: false)"


def engine_path_problems(vllm_config: Any) -> list[str]:
    """Why this engine's speculation would not follow specserve's k; empty where it would."""
    if vllm_config.speculative_config is None:
        return []
    problems = []
    # vLLM 0.34 has no V1 runner and no such property: Model Runner V2 always.
    if getattr(vllm_config, "use_v2_model_runner", True):
        problems.append(
            "vLLM chose Model Runner V2, whose draft-model speculator runs every draft step whatever k is asked: "
            "leave VLLM_USE_V2_MODEL_RUNNER unset (specserve sets it to 0) and drop features that need Model Runner "
            "V2"
        )
    if getattr(vllm_config.scheduler_config, "async_scheduling", False):
        problems.append(
            "async scheduling is on, under which the scheduler gets no draft tokens and the k = 0 skip is off: "
            "leave engine_kwargs.async_scheduling unset (specserve sets it to false)"
        )
    return problems


def require_engine_path(vllm_config: Any) -> None:
    """Raise, naming every problem, unless the engine runs ``ENGINE_PATH``."""
    if problems := engine_path_problems(vllm_config):
        raise RuntimeError("specserve: this engine's k control would do nothing: " + "; ".join(problems))
