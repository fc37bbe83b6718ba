"""Adaptive speculative decoding for a Ray Serve LLM deployment you already run.

One added line makes a model served with ``ray.serve.llm`` speculate under specserve's per-step control; the
rest of the ``LLMConfig`` (model, accelerator, autoscaling, engine sizes) stays as it was::

    from ray import serve
    from ray.serve.llm import LLMConfig, build_openai_app
    from specserve import speculative_llm_config

    llm_config = LLMConfig(
        model_loading_config={"model_id": "llama-8b", "model_source": "meta-llama/Llama-3.1-8B-Instruct"},
        accelerator_type="H100",
        engine_kwargs={"tensor_parallel_size": 2, "max_model_len": 8192},
    )
    llm_config = speculative_llm_config(llm_config, draft="meta-llama/Llama-3.2-1B-Instruct", policy="adaptive")
    serve.run(build_openai_app({"llm_configs": [llm_config]}))

``speculative_llm_config_kwargs`` returns the same fields as a dict, for code that assembles an ``LLMConfig``'s
keyword arguments (or a Serve config file's ``llm_configs`` entry) itself.

Importing this module loads neither Ray nor vLLM nor torch: the replica class travels as the import path that
``LLMConfig`` resolves, and an ``LLMConfig`` is rebuilt through its own class.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from specserve.cluster.config import check_engine_cpus, check_speculation
from specserve.replicas.engine_args import (
    CPU_EXECUTOR_KEY,
    ENGINE_CPUS_KEY,
    DraftOffload,
    EngineSpec,
    speculative_engine_kwargs,
)
from specserve.replicas.engine_env import engine_env

#: Ray Serve LLM's ``LLMServer`` plus specserve's telemetry loop and run-time policy switching.
SERVER_CLS = "specserve.replicas.server.SpecLLMServer"

#: vLLM arguments that carry specserve's control into the engine. A user's own value would switch that control
#: off without a word, or (prefix caching) share KV blocks whose draft half is stale after skipped draft passes.
OWNED_ENGINE_KWARGS = (
    "scheduler_cls",
    "worker_extension_cls",
    "additional_config",
    "speculative_config",
    "enable_prefix_caching",
)

Config = TypeVar("Config")


class Speculation(BaseModel):
    """How every replica of one model speculates. The keys are those of ``specserve serve --config``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    draft: str = Field(description="Draft model: a Hugging Face id or folder with the target's tokenizer.")
    policy: str = Field("adaptive", description="Speculation policy, NAME[:key=value,...], e.g. `fixed:k=3`.")
    k_max: int = Field(4, ge=1, le=16, description="Largest speculation length k; sizes vLLM's buffers.")
    policy_modules: tuple[str, ...] = Field(
        (), description="Modules every engine imports before building the policy: where your own policies register."
    )
    skip_k0_draft_pass: bool = Field(
        True, description="Skip the draft's forward pass at k = 0 and catch its KV up when k > 0 resumes."
    )
    catch_up_max_tokens: int | None = Field(
        None,
        ge=1,
        description="Most tokens one step catches the draft's KV up over; null: 512 on CPU, the token budget on GPU.",
    )
    draft_offload: bool = Field(
        False, description="Elastic draft memory: lend the draft's bytes to the KV cache while k stays 0 under load."
    )
    draft_signals: bool = Field(
        True,
        description="Compute the draft's confidence and entropy per drafted token for the policies that read them.",
    )
    offload_low_free_ratio: float = Field(
        0.10, gt=0, lt=1, description="With draft_offload: offload when free KV blocks stay below this share."
    )
    offload_window_steps: int = Field(
        3, ge=1, description="With draft_offload: steps a trigger must hold before the draft moves."
    )
    offload_min_resident_s: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="With draft_offload: seconds a reloaded draft stays resident before it may be offloaded again.",
    )
    step_log: str | None = Field(
        None, description="Append every engine step to this file as a JSON line, for `bench/policy_replay.py`."
    )
    cpu_executor: Literal["uni", "mp"] = Field(
        "uni", description="CPU engines of one rank: `uni` runs vLLM's worker inside its EngineCore; `mp`: Ray's."
    )
    kv_cache_space_gib: int = Field(1, ge=1, description="CPU only: KV cache size per engine, GiB.")
    cpu_threads: int | None = Field(
        None, ge=1, description="CPU only: OpenMP threads per engine rank. Default: Ray's 1 in a Serve replica."
    )
    engine_cpus: str | None = Field(
        None,
        description="Cores of its own for each one-rank engine (`0`, `0-3`): the replica moves its engine's threads "
        "there. Start the node's Ray on the other cores (taskset -c CORES ray start ...) to keep them apart.",
    )

    @model_validator(mode="after")
    def _policy_parses(self) -> Speculation:
        check_speculation(self.policy, self.policy_modules, self.k_max, self.draft_offload, self.skip_k0_draft_pass)
        return self


def speculative_llm_config_kwargs(
    draft: str,
    *,
    device: Literal["gpu", "cpu"] = "gpu",
    engine_kwargs: Mapping[str, Any] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """``LLMConfig`` keyword arguments that make the replicas speculate with ``draft``.

    Returns ``server_cls``, ``engine_kwargs`` (``engine_kwargs`` given here plus specserve's), ``experimental_configs``,
    and on CPU the ``accelerator_config`` and the ``runtime_env`` with the variables vLLM's CPU backend needs. The
    model itself stays in the caller's ``model_loading_config``. ``options``: the fields of ``Speculation``
    (``policy``, ``k_max``, ...). Raises ``ValueError`` naming a bad option, or an engine argument specserve sets.
    """
    spec = Speculation(draft=draft, **options)
    user = dict(engine_kwargs or {})
    if taken := sorted(set(user) & set(OWNED_ENGINE_KWARGS)):
        raise ValueError(f"engine_kwargs {taken}: specserve sets these to control speculation; leave them out")
    on_gpu = device == "gpu"
    check_engine_cpus(spec.engine_cpus, user.get("tensor_parallel_size", 1), spec.cpu_executor, on_gpu)
    ours = speculative_engine_kwargs(
        EngineSpec(
            target="",  # the model comes from model_loading_config; only the keys below are kept
            draft=spec.draft,
            policy=spec.policy,
            max_k=spec.k_max,
            # Only the end of the one row of vLLM's batch-size table (which the scheduler overrides every step);
            # vLLM carries the last row's k on to larger batches, so vLLM's own default batch size needs no number.
            max_num_seqs=user.get("max_num_seqs", 1),
            skip_k0_draft_pass=spec.skip_k0_draft_pass,
            catch_up_max_tokens=spec.catch_up_max_tokens,
            draft_signals=spec.draft_signals,
            step_log=spec.step_log,
            policy_modules=spec.policy_modules,
            draft_offload=(
                DraftOffload(spec.offload_low_free_ratio, spec.offload_window_steps, spec.offload_min_resident_s)
                if spec.draft_offload
                else None
            ),
        )
    )
    kwargs: dict[str, Any] = {
        "server_cls": SERVER_CLS,
        "engine_kwargs": {
            # Defaults the caller's engine_kwargs may override: CUDA graphs on GPU; on CPU eager mode saves a
            # ~35 s torch.compile at start. Ray Serve LLM exports vLLM's metrics only with stats on.
            "enforce_eager": not on_gpu,
            "disable_log_stats": False,
            **user,
            **{key: ours[key] for key in OWNED_ENGINE_KWARGS},
        },
        "experimental_configs": {
            CPU_EXECUTOR_KEY: spec.cpu_executor,
            **({ENGINE_CPUS_KEY: spec.engine_cpus} if spec.engine_cpus is not None else {}),
        },
    }
    if not on_gpu:
        kwargs["accelerator_config"] = {"kind": "cpu"}
        env = engine_env(
            None,
            tp=user.get("tensor_parallel_size", 1),
            kv_cache_space_gib=spec.kv_cache_space_gib,
            cpu_threads=spec.cpu_threads,
            engine_cpus=spec.engine_cpus,
        )
        kwargs["runtime_env"] = {"env_vars": env}
    return kwargs


def speculative_llm_config(llm_config: Config, draft: str, **options: Any) -> Config:
    """``llm_config`` (a Ray Serve LLM ``LLMConfig``, or the dict of its fields) with speculation added.

    Its engine_kwargs, runtime_env and experimental_configs are kept and merged with specserve's (the caller's
    environment variables win); the device follows its ``accelerator_config`` (GPU unless its kind is ``cpu``).
    Returns the same type it was given. ``options``: as for ``speculative_llm_config_kwargs``.
    """
    if isinstance(llm_config, BaseModel):
        # The accelerator as LLMConfig resolved it (from its kind, accelerator_type or placement bundles).
        fields, accelerator = llm_config.model_dump(exclude_unset=True), llm_config.accelerator_config  # type: ignore[attr-defined]
    elif isinstance(llm_config, Mapping):
        fields = dict(llm_config)
        accelerator = fields.get("accelerator_config")
    else:
        raise TypeError(f"expected an LLMConfig or a dict of its fields, got {type(llm_config).__name__}")
    server_cls = _server_cls(fields.get("server_cls"))
    ours = speculative_llm_config_kwargs(
        draft, device=_device(accelerator), engine_kwargs=fields.get("engine_kwargs"), **options
    )
    runtime_env = dict(fields.get("runtime_env") or {})
    env_vars = {**ours.get("runtime_env", {}).get("env_vars", {}), **runtime_env.get("env_vars", {})}
    if env_vars:
        runtime_env["env_vars"] = env_vars
    fields.update(
        server_cls=server_cls,
        engine_kwargs=ours["engine_kwargs"],
        experimental_configs={**fields.get("experimental_configs", {}), **ours["experimental_configs"]},
    )
    if runtime_env:
        fields["runtime_env"] = runtime_env
    return type(llm_config).model_validate(fields) if isinstance(llm_config, BaseModel) else fields  # type: ignore[return-value]


def _server_cls(given: Any) -> Any:
    """specserve's replica class, or the caller's subclass of it (as a class or an import path)."""
    if given in (None, SERVER_CLS):
        return SERVER_CLS
    cls = given
    if isinstance(given, str):  # only here does a config name a class that may load Ray
        module, _, name = given.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
    from specserve.replicas.server import SpecLLMServer

    if isinstance(cls, type) and issubclass(cls, SpecLLMServer):
        return given
    raise ValueError(f"server_cls {given!r}: specserve serves through {SERVER_CLS}; subclass that one instead")


def _device(accelerator_config: Any) -> Literal["gpu", "cpu"]:
    """Ray Serve LLM's default is a GPU; only an explicit CPU kind (a dict or Ray's CPUConfig) means CPU."""
    if isinstance(accelerator_config, Mapping):
        kind = accelerator_config.get("kind")
    else:
        kind = getattr(accelerator_config, "kind", None)
    return "cpu" if kind == "cpu" else "gpu"
