"""The k = 0 skip rule over vLLM's objects (vLLM 0.32.0): the switch both engine processes read from the config, and
the step's numbers the scheduler (``core/scheduler.py``) decides each step's draft pass from. The worker applies what
the scheduler decided (``signalled_drafts.step_plan``); the rule itself is
``specserve.speculation.draft_sync.skips_draft_pass``. No vLLM import at run time.

Private vLLM interfaces read: ``VllmConfig.additional_config`` / ``speculative_config`` /
``scheduler_config.async_scheduling``; ``SchedulerOutput.num_spec_tokens_to_schedule``,
``scheduled_new_reqs`` (``NewRequestData.req_id``), ``scheduled_cached_reqs.resumed_req_ids``, ``num_scheduled_tokens``,
``total_num_scheduled_tokens`` (``vllm/v1/core/sched/output.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specserve.replicas.config.engine_args import ADDITIONAL_CONFIG_KEY, EngineControlConfig
from specserve.speculation.draft_sync import CPU_CATCH_UP_MAX_TOKENS, draft_pass_room, skips_draft_pass
from specserve.speculation.methods import Method, method

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput


def engine_method(vllm_config: Any) -> Method | None:
    """The engine's speculative method (``specserve.speculation.methods``); None without speculation."""
    spec = vllm_config.speculative_config
    return None if spec is None else method(spec.method)


def skipping_enabled(vllm_config: Any) -> bool:
    """Whether this engine skips the draft pass on k = 0 decode steps.

    Off without speculation, without specserve's settings, when ``skip_k0_draft_pass`` is false, for methods whose
    k = 0 runs the proposer (``Method.k0``: a head reading the target's hidden states), and under async scheduling,
    where vLLM's runner hands a step's sampled tokens to the next step through the draft path a skip leaves out (GPU
    only: CPU vLLM forces synchronous scheduling).
    """
    data = (vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
    if not data:
        return False
    m = engine_method(vllm_config)
    if m is None or not m.skips_at_k0():
        return False
    if getattr(vllm_config.scheduler_config, "async_scheduling", False):
        return False
    return EngineControlConfig.from_additional_config(data).skip_k0_draft_pass


def tracks_draft_kv(vllm_config: Any) -> bool:
    """Whether a skipped pass leaves a lag to catch up: skipping is on and the method keeps per-request state its
    proposer must be fed (a draft model's KV); n-gram lookup keeps none."""
    m = engine_method(vllm_config)
    return skipping_enabled(vllm_config) and m is not None and m.catches_up()


_RUNNER_ATTR = "_specserve_skips_k0_draft_pass"


def runner_skips(runner: Any) -> bool:
    """``skipping_enabled`` for a worker's model runner, read from its config once and kept on it."""
    enabled = getattr(runner, _RUNNER_ATTR, None)
    if enabled is None:
        enabled = skipping_enabled(runner.vllm_config)
        setattr(runner, _RUNNER_ATTR, enabled)
    return enabled


def catch_up_cap(vllm_config: Any) -> int | None:
    """Most tokens a step's draft pass catches up over (``draft_sync.catch_up_plan``'s ``max_tokens``): the
    configured ``catch_up_max_tokens``, else ``draft_sync.CPU_CATCH_UP_MAX_TOKENS`` on a CPU engine and no cap
    beyond the token budget elsewhere."""
    data = (vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
    configured = EngineControlConfig.from_additional_config(data).catch_up_max_tokens
    if configured is not None:
        return configured
    return CPU_CATCH_UP_MAX_TOKENS if getattr(vllm_config.device_config, "device_type", None) == "cpu" else None


def catch_up_room(token_budget: int, output: SchedulerOutput) -> int:
    """``draft_sync.draft_pass_room`` for one step's ``SchedulerOutput``."""
    return draft_pass_room(token_budget, output.total_num_scheduled_tokens, len(output.num_scheduled_tokens))


CATCH_UP_PROFILE = Path(__file__).with_name("catch_up_cpu.json")


def resume_cost(vllm_config: Any) -> float | None:
    """Seconds per catch-up token when k > 0 resumes (``EngineTraits.resume_s_per_token``): 0 for a method with
    nothing to catch up; the CPU profile ``lab/studies/catch_up/catch_up_cost.py`` measured, on a CPU engine; None
    elsewhere (not measured there: policies fall back to their own model)."""
    if not tracks_draft_kv(vllm_config):
        return 0.0 if skipping_enabled(vllm_config) else None
    if getattr(vllm_config.device_config, "device_type", None) != "cpu" or not CATCH_UP_PROFILE.is_file():
        return None
    return float(json.loads(CATCH_UP_PROFILE.read_text())["fit"]["s_per_token"])


def entering_request_ids(output: SchedulerOutput) -> list[str]:
    """The requests that enter the batch this step: new ones, and those resumed after preemption. Their first step
    may start at a prefix-cache hit, so the scheduler's tracker forgets them before taking lags
    (``DraftKVTracker.forget``)."""
    return [r.req_id for r in output.scheduled_new_reqs] + sorted(output.scheduled_cached_reqs.resumed_req_ids)


def step_skips_draft_pass(enabled: bool, output: SchedulerOutput, draft_resident: bool = True) -> bool:
    """``skips_draft_pass`` over one step's ``SchedulerOutput``."""
    return skips_draft_pass(
        enabled=enabled,
        k=output.num_spec_tokens_to_schedule,
        num_new_requests=len(output.scheduled_new_reqs) + len(output.scheduled_cached_reqs.resumed_req_ids),
        num_scheduled_tokens=output.num_scheduled_tokens.values(),
        draft_resident=draft_resident,
    )
