"""Adaptive speculative decoding for a Ray Serve LLM deployment you already run.

One added line makes a model served with ``ray.serve.llm`` speculate under specserve's per-step control; the
rest of the ``LLMConfig`` (model, accelerator, autoscaling, engine sizes) stays as it was::

    from ray import serve
    from ray.serve.llm import LLMConfig
    import specserve
    from specserve import speculative_llm_config

    llm_config = LLMConfig(
        model_loading_config={"model_id": "llama-8b", "model_source": "meta-llama/Llama-3.1-8B-Instruct"},
        accelerator_type="H100",
        engine_kwargs={"tensor_parallel_size": 2, "max_model_len": 8192},
    )
    llm_config = speculative_llm_config(llm_config, draft="meta-llama/Llama-3.2-1B-Instruct", policy="adaptive")
    serve.run(specserve.build_openai_app([llm_config]))

``specserve.build_openai_app`` is Ray Serve LLM's builder of the same name with specserve's ingress in front (OpenAI
error objects for bad input, an API key, overload answers with Retry-After); Ray's own builder serves the same
replicas without it. Each replica starts the cluster's controller, or joins it, so `specserve status` and
`policy set` work either way.

``speculative_llm_config_kwargs`` returns the same fields as a dict, for code that assembles an ``LLMConfig``'s
keyword arguments (or a Serve config file's ``llm_configs`` entry) itself.

Importing this module loads neither Ray nor vLLM nor torch: the replica class travels as the import path that
``LLMConfig`` resolves, and an ``LLMConfig`` is rebuilt through its own class.
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specserve.cpu_list import parse_cpu_list
from specserve.messages import ON_HEAD_NODE
from specserve.replicas.config.engine_args import (
    CONTROLLER_KEY,
    CPU_EXECUTOR_KEY,
    ENGINE_CPUS_KEY,
    GPU_ENGINE_ENV,
    GPU_ENGINE_KWARGS,
    STARTUP_CHECKS_KEY,
    DraftOffload,
    EngineSpec,
    speculative_engine_kwargs,
)
from specserve.replicas.config.engine_env import engine_env
from specserve.speculation import EngineTraits, make_policy, methods

__all__ = [
    "ConfigNote",
    "CpuEngine",
    "Speculation",
    "check_engine_kwargs",
    "openai_app_args",
    "speculative_llm_config",
    "speculative_llm_config_kwargs",
]

#: The speculative methods specserve controls (``specserve.speculation.methods``). Other methods of vLLM's
#: ``speculative_config`` are refused by name.
METHODS = tuple(methods.METHODS)


def check_method(name: str, draft: str | None, draft_offload: bool) -> None:
    """The method's own checks: the pinned vLLM can serve it under per-step k, its draft or head is named where it
    needs one and absent where it takes none, and offload has a draft model to offload. Raises ValueError naming the
    key."""
    m = methods.method(name)
    why = methods.refusal(name, has_suffix_library=importlib.util.find_spec("arctic_inference") is not None)
    if why:
        raise ValueError(f"method {name}: {why}")
    # The bundled target brings its own draft: a missing one is checked where the models are resolved.
    methods.check_draft(m, draft, required=False)
    if draft_offload and not m.offloadable:
        raise ValueError(methods.offload_refusal(m))


def check_speculation(
    policy: str, policy_modules: Sequence[str], max_k: int, draft_offload: bool, skip_k0_draft_pass: bool
) -> None:
    """The speculation keys' own checks: the policy modules import, the policy parses, and offload has the skip it
    needs. Raises ValueError naming the key."""
    for module in policy_modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(f"policy_modules: cannot import {module!r}: {exc}") from None
    try:
        make_policy(policy, EngineTraits(max_k=max_k))
    except ValueError as exc:  # names the bad name/key/value
        raise ValueError(f"policy: {exc}") from None
    if draft_offload and not skip_k0_draft_pass:
        raise ValueError("draft_offload needs skip_k0_draft_pass: an offloaded draft's KV must be able to lag")


def check_engine_cpus(engine_cpus: str | None, tp: int, cpu_executor: str = "uni", on_gpu: bool = False) -> None:
    """``cpu.engine_cpus``'s own checks: a CPU engine of one rank on the uniprocess executor, the case measured. Where
    the EngineCore and a worker process both run (the ``mp`` executor, every GPU engine), the EngineCore waits for the
    worker by spinning, and on the worker's cores that spin would take their time."""
    if engine_cpus is None:
        return
    try:
        parse_cpu_list(engine_cpus)
    except ValueError as e:
        raise ValueError(f"engine_cpus: {e}") from None
    if tp > 1:
        raise ValueError(
            f"engine_cpus {engine_cpus!r} gives one engine rank its cores; at tp={tp} vLLM binds each rank's threads "
            "itself (VLLM_CPU_OMP_THREADS_BIND, one core range per rank)"
        )
    if on_gpu:
        raise ValueError(f"engine_cpus {engine_cpus!r} is for CPU engines; a GPU engine's model runs on its device")
    if cpu_executor != "uni":
        raise ValueError(
            f"engine_cpus {engine_cpus!r} with executor: {cpu_executor}: the EngineCore would spin on the worker's "
            "cores while it waits for each step; use executor: uni"
        )


class Speculation(BaseModel):
    """How every replica of one model speculates: the ``speculation:`` section of a config file, the options of
    ``specserve.speculative_llm_config``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal[METHODS] = Field(  # type: ignore[valid-type]
        "draft_model",
        description="Speculative method: `draft_model` (a separate draft model sharing the target's tokenizer), "
        "`eagle` / `eagle3` (a head trained on the target's hidden states, named by `draft`), `mtp` (the target's "
        "own multi-token-prediction layers), `ngram` (prompt lookup in the request's own tokens), `suffix` (refused "
        "on the pinned vLLM: docs/user-guide/speculation-methods.md).",
    )
    draft: str | None = Field(
        None,
        description="The draft model (`draft_model`) or head (`eagle`, `eagle3`): a Hugging Face id (resolved by "
        "vLLM on each node) or a folder (read on each node that runs a replica). Required with your own target for "
        "those methods, refused for `mtp` and `ngram`; default: the bundled tiny draft (or EAGLE-3 head) with the "
        "bundled tiny target.",
    )
    policy: str = Field("adaptive", description="Speculation policy, NAME[:key=value,...], e.g. `fixed:k=3`.")
    max_k: int = Field(
        4,
        ge=1,
        le=16,
        description="Largest speculation length k: vLLM's num_speculative_tokens, which sizes its buffers; every "
        "policy picks k in 0..max_k each step.",
    )
    policy_modules: tuple[str, ...] = Field(
        (),
        description="Python modules imported before the policy is built, in every engine too: each may register its "
        "own policies with `specserve.speculation.register`.",
    )
    skip_k0_draft_pass: bool = Field(
        True,
        description="Skip the draft's forward pass on k = 0 decode steps and catch its KV up when k > 0 resumes; "
        "false: vLLM's own behaviour (the draft runs every step).",
    )
    catch_up_max_tokens: int | None = Field(
        None,
        ge=1,
        description="Most tokens one step's draft pass catches up over for requests whose draft KV lags (after k = 0 "
        "stretches, prefix-cache hits, and every request's whole context after a draft reload), so that a catch-up "
        "is spread over steps as a chunked prefill is. null: 512 on a CPU engine; on a GPU, what the step's token "
        "budget leaves.",
    )
    draft_signals: bool = Field(
        True,
        description="Compute, in each engine's worker, the draft's confidence and entropy per drafted token from its "
        "logits (slo, mlp and adaptive read them); false saves a softmax over the vocabulary per draft pass.",
    )
    draft_offload: bool = Field(
        False,
        description="Elastic draft memory (Nightjar's triggers): offload the draft and grow the KV cache into its "
        "bytes while k stays 0 and free KV blocks stay low; reload it when the queue is empty and memory is free.",
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
    min_resident_drafts: int = Field(
        0,
        ge=0,
        description="With draft_offload: replicas whose draft the controller keeps resident (an offload that would "
        "leave fewer is refused), so some always speculate.",
    )
    max_concurrent_reloads: int | None = Field(
        None,
        ge=1,
        description="With draft_offload: draft reloads the controller lets run at once per node; default: as many as "
        "finish within 0.1 s at their share of the node's host-to-device bandwidth.",
    )
    controller_batching: Literal["auto", "none", "node"] = Field(
        "auto",
        description="How replicas push their telemetry to the cluster controller: `none`, each replica its own call "
        "(enough to about a thousand replicas); `node`, through one agent per node that sends its node's replicas "
        "in one call, for clusters of thousands; `auto`, directly until the controller counts 256 live replicas, "
        "then through the agents (back below 128). See the controller page for the measurements.",
    )
    startup_checks: Literal["fallback", "refuse", "off"] = Field(
        "fallback",
        description="Before a replica serves, dummy runs at every k check that k is honoured, that k = 0 runs no "
        "draft pass and that draft signals arrive, and time its steps for the policy's cost model (a few seconds). "
        "On a failed check: `fallback` serves under fixed:k=max_k (vLLM's own behaviour) and says so in logs, "
        "metrics and `status`; `refuse` fails the replica's start; `off` skips the checks and the calibration.",
    )
    step_log: str | None = Field(
        None,
        description="Append every engine step (the policy's context, the k it chose, what the step ran and cost) to "
        "this file as one JSON line, every replica to the same file, for replaying the policy's decisions offline.",
    )

    @model_validator(mode="after")
    def _policy_parses(self) -> Speculation:
        check_method(self.method, self.draft, self.draft_offload)
        check_speculation(self.policy, self.policy_modules, self.max_k, self.draft_offload, self.skip_k0_draft_pass)
        return self


class CpuEngine(BaseModel):
    """Settings of engines that run on CPUs (vLLM's CPU backend); a GPU engine ignores them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kv_cache_space_gib: int = Field(1, ge=1, description="KV cache size per engine, GiB (VLLM_CPU_KVCACHE_SPACE).")
    threads: int | None = Field(
        None,
        ge=1,
        description="OpenMP threads per engine rank (OMP_NUM_THREADS). Default: Ray's 1, as it gives an actor that "
        "reserves no CPU, which Serve's replicas are; with engine_cpus, one per core.",
    )
    engine_cpus: str | None = Field(
        None,
        description="Cores of its own for each engine of one rank (`0`, `0-3`, `0,2-3`): the replica moves its "
        "engine's threads there, and a local cluster runs Ray's and Serve's processes on the other cores.",
    )
    executor: Literal["uni", "mp"] = Field(
        "uni",
        description="Engines of one rank: `uni` runs vLLM's worker inside its EngineCore process; `mp` is Ray Serve "
        "LLM's default, a worker process the EngineCore waits on by spinning (a core lost on small machines).",
    )

    @field_validator("engine_cpus")
    @classmethod
    def _cores_parse(cls, engine_cpus: str | None) -> str | None:
        check_engine_cpus(engine_cpus, tp=1)
        return engine_cpus


#: Ray Serve LLM's ``LLMServer`` plus specserve's telemetry loop and run-time policy switching.
SERVER_CLS = "specserve.replicas.serve.server.SpecLLMServer"

#: The ingress in front of the replicas, as the import path a Serve config file names too.
INGRESS_CLS = "specserve.replicas.serve.ingress:SpecServeIngress"

#: vLLM arguments that carry specserve's control into the engine, and what to set instead. A user's own value would
#: switch that control off without a word. Prefix caching is not among them: a prefix hit's draft KV counts as draft
#: lag and is caught up.
OWNED_ENGINE_KWARGS = {
    "scheduler_cls": "specserve runs its own scheduler (its k control); subclass "
    "specserve.replicas.core.scheduler.AdaptiveKScheduler and register a policy instead",
    "worker_extension_cls": "specserve's worker extension skips the draft pass at k = 0; it cannot be replaced",
    "additional_config": "specserve carries its settings there; put yours in the speculation section",
    # vLLM's shorthands for speculative_config's method, model and num_speculative_tokens (EngineArgs.spec_*).
    "spec_method": "set speculation.method instead",
    "spec_model": "set speculation.draft instead",
    "spec_tokens": "set speculation.max_k instead",
}

#: Keys of vLLM's ``speculative_config`` that specserve sets, and the speculation key that says the same. Its other
#: keys (``prompt_lookup_min``/``max``, ``draft_tensor_parallel_size``, the draft's ``quantization``, ``revision``,
#: ``max_model_len``, ...) pass through untouched; the start-up checks then verify the k control on the result.
OWNED_SPECULATIVE_KEYS = {
    "method": "speculation.method",
    "model": "speculation.draft",
    "num_speculative_tokens": "speculation.max_k",
    "num_speculative_tokens_per_batch_size": None,
}

#: Flat options of earlier releases, now in ``cpu`` (read with a DeprecationWarning this release only).
_LEGACY_CPU_OPTIONS = {
    "cpu_executor": "executor",
    "kv_cache_space_gib": "kv_cache_space_gib",
    "cpu_threads": "threads",
    "engine_cpus": "engine_cpus",
}

Config = TypeVar("Config")


# The per-step control needs one engine core per replica that steps one batch at a time: each step's k is chosen from
# the verdicts of the step before (vLLM 0.32). Either setting breaks that, so it is refused rather than left to fail
# or to do nothing.
ONE_ENGINE_STEP_AT_A_TIME: dict[str, str] = {
    # With PP > 1 EngineCore keeps that many batches in flight (EngineCore.step_with_batch_queue): a batch is
    # scheduled, its k chosen, before the batches ahead of it are verified, and draft ids reach the scheduler late.
    "pipeline_parallel_size": "pipeline parallelism keeps several batches in flight (vLLM's batch queue), so a "
    "step's k would be chosen before the steps ahead of it are verified; spread the model with "
    "tensor_parallel_size instead",
    # Ray Serve LLM runs data parallelism through its DPServer (one Serve replica per DP rank, gang-scheduled);
    # specserve's server is an LLMServer with one engine, whose telemetry and control speak for one engine core.
    "data_parallel_size": "specserve runs one vLLM engine per Ray Serve replica; scale out with "
    "deployment_config.num_replicas or autoscaling_config instead",
}


def check_engine_kwargs(engine_kwargs: Mapping[str, Any]) -> None:
    """vLLM engine arguments pass through untouched, except those that carry specserve's control into the engine and
    those that would put the engine on a path where that control does nothing. Raises ValueError naming the key."""
    for key, instead in OWNED_ENGINE_KWARGS.items():
        if key in engine_kwargs:
            raise ValueError(f"engine_kwargs.{key}: set by specserve: {instead}")
    check_speculative_config(engine_kwargs.get("speculative_config", {}))
    if engine_kwargs.get("async_scheduling"):
        raise ValueError(
            "engine_kwargs.async_scheduling: true: specserve's per-step k control runs on vLLM's synchronous "
            "scheduler (under async scheduling the scheduler gets no draft tokens and the k = 0 skip is off); "
            "leave it unset"
        )
    for key, why in ONE_ENGINE_STEP_AT_A_TIME.items():
        value = engine_kwargs.get(key)
        if value is not None and value != 1:
            raise ValueError(f"engine_kwargs.{key} = {value!r}: not supported: {why}")


def check_speculative_config(config: object) -> None:
    """A caller's own ``speculative_config`` may carry any of vLLM's keys but those specserve sets; one of those is
    refused with the speculation key to write it as (the whole line, for a config moved from ``vllm serve``). Raises
    ValueError naming the key and value."""
    if not isinstance(config, Mapping):
        raise ValueError(f"engine_kwargs.speculative_config: {config!r} is not a mapping of vLLM's keys")
    given = _vllm_keys(config)
    for key, instead in OWNED_SPECULATIVE_KEYS.items():
        if key not in given:
            continue
        value = given[key]
        if instead is None:
            why = "specserve's policy chooses k at every step, within speculation.max_k"
        else:
            why = f"write {instead}: {value} instead (vLLM's {key})"
        raise ValueError(f"engine_kwargs.speculative_config.{key} = {value!r}: set by specserve: {why}")


def _vllm_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with its keys as vLLM reads them (``EngineArgs.create_speculative_config`` turns - into _)."""
    return {str(key).replace("-", "_"): value for key, value in config.items()}


def speculative_llm_config_kwargs(
    draft: str | None = None,
    *,
    device: Literal["gpu", "cpu"] = "gpu",
    engine_kwargs: Mapping[str, Any] | None = None,
    cpu: CpuEngine | Mapping[str, Any] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """``LLMConfig`` keyword arguments that make the replicas speculate with ``draft``.

    Returns ``server_cls``, ``engine_kwargs`` (``engine_kwargs`` given here, untouched, plus specserve's),
    ``experimental_configs``, the ``runtime_env`` with the variables the engine path needs, and on CPU the
    ``accelerator_config``. The model itself stays in the caller's ``model_loading_config``. ``options``: the fields of
    ``Speculation`` (``policy``, ``max_k``, ...); ``cpu``: those of ``CpuEngine``. Raises ``ValueError`` naming a bad
    option, or an engine argument specserve sets.
    """
    options, cpu = _legacy_options(options, cpu)
    spec = Speculation(draft=draft, **options)
    cpu_engine = cpu if isinstance(cpu, CpuEngine) else CpuEngine(**(cpu or {}))
    user = dict(engine_kwargs or {})
    check_engine_kwargs(user)
    on_gpu = device == "gpu"
    check_engine_cpus(cpu_engine.engine_cpus, user.get("tensor_parallel_size", 1), cpu_engine.executor, on_gpu)
    methods.check_draft(methods.method(spec.method), spec.draft)
    ours = speculative_engine_kwargs(
        EngineSpec(
            target="",  # the model comes from model_loading_config; only the keys below are kept
            draft=spec.draft,
            method=spec.method,
            policy=spec.policy,
            max_k=spec.max_k,
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
            **(GPU_ENGINE_KWARGS if on_gpu else {}),
            **user,
            **{key: ours[key] for key in OWNED_ENGINE_KWARGS if key in ours},
            # vLLM's other speculative settings are the caller's; specserve's keys are checked absent from them.
            "speculative_config": {**ours["speculative_config"], **_vllm_keys(user.get("speculative_config", {}))},
        },
        "experimental_configs": {
            **({} if on_gpu else {CPU_EXECUTOR_KEY: cpu_engine.executor}),
            # The replica starts or joins the cluster's controller with these (server.py).
            CONTROLLER_KEY: {
                "min_resident_drafts": spec.min_resident_drafts,
                "max_concurrent_reloads": spec.max_concurrent_reloads,
                "batching": spec.controller_batching,
            },
            STARTUP_CHECKS_KEY: spec.startup_checks,
            **({ENGINE_CPUS_KEY: cpu_engine.engine_cpus} if cpu_engine.engine_cpus is not None else {}),
        },
    }
    if on_gpu:
        kwargs["runtime_env"] = {"env_vars": dict(GPU_ENGINE_ENV)}
    else:
        kwargs["accelerator_config"] = {"kind": "cpu"}
        env = engine_env(
            None,
            tp=user.get("tensor_parallel_size", 1),
            kv_cache_space_gib=cpu_engine.kv_cache_space_gib,
            cpu_threads=cpu_engine.threads,
            engine_cpus=cpu_engine.engine_cpus,
        )
        kwargs["runtime_env"] = {"env_vars": env}
    return kwargs


def _legacy_options(
    options: dict[str, Any], cpu: CpuEngine | Mapping[str, Any] | None
) -> tuple[dict[str, Any], CpuEngine | Mapping[str, Any] | None]:
    """``k_max`` and the flat CPU options of earlier releases, renamed with a DeprecationWarning."""
    options = dict(options)
    if "k_max" in options:
        warnings.warn("k_max is now max_k; the old name is read this release only", DeprecationWarning, stacklevel=3)
        options.setdefault("max_k", options.pop("k_max"))
    flat = {new: options.pop(old) for old, new in _LEGACY_CPU_OPTIONS.items() if old in options}
    if flat:
        names = ", ".join(f"cpu={{{new!r}: ...}}" for new in flat)
        warnings.warn(f"CPU options now go in {names}; read this release only", DeprecationWarning, stacklevel=3)
        given = cpu.model_dump() if isinstance(cpu, CpuEngine) else dict(cpu or {})
        cpu = {**flat, **given}
    return options, cpu


class ConfigNote(UserWarning):
    """A setting that is valid but will not do what it says; the command line prints it as one line."""


def autoscaling_note(deployment_config: Mapping[str, Any]) -> str | None:
    """Why ``deployment_config``'s autoscaling would never add a replica, or None.

    Ray Serve LLM 2.60 deep-merges its default ``target_ongoing_requests`` (10**9 a replica,
    ``RAY_SERVE_LLM_DEFAULT_MAX_TARGET_ONGOING_REQUESTS``) under the caller's ``autoscaling_config``
    (``maybe_apply_llm_deployment_config_defaults``), so a range without its own target, and without a custom policy,
    stays at its first replica count whatever the load."""
    scaling = deployment_config.get("autoscaling_config")
    if not isinstance(scaling, Mapping) or "target_ongoing_requests" in scaling or "policy" in scaling:
        return None
    low, high = scaling.get("min_replicas", 1), scaling.get("max_replicas", 1)
    if not (isinstance(low, int) and isinstance(high, int)) or high <= low:
        return None  # no range to scale over, or values Ray Serve's own validation will name
    return (
        "deployment_config.autoscaling_config has no target_ongoing_requests: Ray Serve LLM's default (10^9 "
        "requests a replica) never adds a replica; set it to the requests one replica should hold (for example "
        "three quarters of engine_kwargs.max_num_seqs)"
    )


def speculative_llm_config(llm_config: Config, draft: str | None = None, **options: Any) -> Config:
    """``llm_config`` (a Ray Serve LLM ``LLMConfig``, or the dict of its fields) with speculation added.

    Nothing else the caller set changes: its engine_kwargs pass through untouched (prefix caching, sizes, quantization
    included), and its runtime_env and experimental_configs are merged with specserve's (the caller's environment
    variables win, except those that choose the engine path, which must stay as specserve sets them). The device
    follows its ``accelerator_config`` (GPU unless its kind is ``cpu``). Returns the same type it was given.
    ``options``: as for ``speculative_llm_config_kwargs``. An ``llm_config`` that already speculates keeps its
    speculation: its ``speculative_config``'s ``method``, ``model`` and ``num_speculative_tokens`` are read as
    ``method``, ``draft`` and ``max_k`` (given here too, they must agree), and its other keys stay.
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
    note = autoscaling_note(fields.get("deployment_config") or {})
    if note:
        warnings.warn(note, ConfigNote, stacklevel=2)
    engine_kwargs, draft, options = _adopt_speculative_config(fields.get("engine_kwargs"), draft, options)
    ours = speculative_llm_config_kwargs(draft, device=_device(accelerator), engine_kwargs=engine_kwargs, **options)
    runtime_env = dict(fields.get("runtime_env") or {})
    given_env = runtime_env.get("env_vars", {})
    for name, value in GPU_ENGINE_ENV.items():
        if name in given_env and str(given_env[name]) != value:
            raise ValueError(
                f"runtime_env.env_vars.{name}={given_env[name]!r}: specserve's k control runs on vLLM's V1 model "
                f"runner ({name}={value}); leave it unset"
            )
    env_vars = {**ours["runtime_env"]["env_vars"], **given_env}
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


#: What an ``LLMConfig`` that already speculates says in its ``speculative_config``, and the option it becomes.
_ADOPTED = {"method": "method", "model": "draft", "num_speculative_tokens": "max_k"}


def _adopt_speculative_config(
    engine_kwargs: Mapping[str, Any] | None, draft: str | None, options: dict[str, Any]
) -> tuple[dict[str, Any], str | None, dict[str, Any]]:
    """The speculation an ``LLMConfig`` already runs, taken over: its ``speculative_config``'s method, model and
    token count become the options ``method``, ``draft`` and ``max_k`` (an option given too must say the same), and
    leave it, which keeps vLLM's other keys. Returns the engine arguments, the draft and the options."""
    engine = dict(engine_kwargs or {})
    config = engine.get("speculative_config")
    if not isinstance(config, Mapping):
        return engine, draft, options  # none, or not a mapping: check_speculative_config names it
    rest, options = _vllm_keys(config), {**options, "draft": draft}
    for key, option in _ADOPTED.items():
        if key not in rest:
            continue
        value = rest.pop(key)
        given = options.get(option)
        if given is not None and given != value:
            raise ValueError(
                f"engine_kwargs.speculative_config.{key} = {value!r} and {option}={given!r} disagree: give one of them"
            )
        options[option] = value
    engine["speculative_config"] = rest
    return engine, options.pop("draft"), options


def openai_app_args(llm_configs: Sequence[Any], *, api_key: Any = None, retry_after_s: float = 1.0) -> dict[str, Any]:
    """The arguments of Ray Serve LLM's ``build_openai_app`` that put specserve's ingress in front of ``llm_configs``.

    ``api_key`` None: the ingress reads SPECSERVE_API_KEY from its own environment (the head node's), so that no
    key is written into the application's arguments, which Serve shows (`serve status`, its dashboard)."""
    ingress_kwargs: dict[str, Any] = {"retry_after_s": retry_after_s}
    if api_key is not None:
        # A SecretStr stays masked in any repr Serve logs of the deployment's arguments.
        ingress_kwargs["api_key"] = api_key
    return {
        "llm_configs": list(llm_configs),
        "ingress_cls_config": {"ingress_cls": INGRESS_CLS, "ingress_extra_kwargs": ingress_kwargs},
        # The ingress only routes: no CPU, which would starve the engines on small machines, and on the head node,
        # so that a worker node that fails takes only its own engines' requests with it.
        "ingress_deployment_config": {"ray_actor_options": {"num_cpus": 0, "resources": dict(ON_HEAD_NODE)}},
    }


def _server_cls(given: Any) -> Any:
    """specserve's replica class, or the caller's subclass of it (as a class or an import path)."""
    if given in (None, SERVER_CLS):
        return SERVER_CLS
    cls = given
    if isinstance(given, str):  # only here does a config name a class that may load Ray
        module, _, name = given.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
    from specserve.replicas.serve.server import SpecLLMServer

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
