"""Build the Ray Serve application: Ray Serve LLM's OpenAI ingress over SpecLLMServer replicas.

A ``ServeConfig`` (an ``LLMConfig`` plus specserve's sections) resolves into the one ``LLMConfig`` a Ray Serve LLM
user would write, made speculative by the public ``specserve.speculative_llm_config``, so the command line, Serve
config files and users' own Ray Serve LLM code get the same replicas. Builders return unstarted applications:
`cluster/local.py` runs them for `specserve serve`; ``serve_document`` is what `specserve config render` prints, a
Serve config file on Ray Serve LLM's own builder; ``build_from_args`` is the builder a hand-written Serve config file
may name instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, model_validator

from specserve.cluster.config import ConfigError, ServeConfig, describe
from specserve.cluster.sections import check_engine_cpus
from specserve.llm import openai_app_args, speculative_llm_config
from specserve.replicas.config.engine_args import GPU_ENGINE_ENV, GPU_ENGINE_KWARGS
from specserve.replicas.config.engine_env import engine_env
from specserve.speculation.methods import Source, method

#: The bundled tiny pair's name for clients, and the sizes its CPU engine is measured with.
TINY_MODEL_ID = "specserve-tiny"
#: A CPU engine's sizes unless the config sets them: vLLM's defaults (the model's whole context, 256 sequences) are a
#: GPU's and would not fit a CPU's KV cache. bfloat16 and a fixed seed: the tiny pair's outputs and the benchmarks'
#: numbers were taken with these. A GPU engine keeps vLLM's own defaults.
CPU_ENGINE_DEFAULTS = {"max_model_len": 512, "max_num_seqs": 8, "dtype": "bfloat16", "seed": 0}


@dataclass(frozen=True, slots=True)
class ResolvedServe:
    """Values derived from ServeConfig at start-up (never written back into it)."""

    config: ServeConfig
    target: Any
    # None for a method without a draft or head (``specserve.speculation.methods.Source``).
    draft: str | None
    on_gpu: bool
    # Environment for every Ray worker that may host an engine (specserve.replicas.config.engine_env); variables
    # vLLM's CPU backend needs and the caller left out are added by speculative_llm_config.
    env_vars: dict[str, str]

    @property
    def model_id(self) -> str:
        """What clients send in the `model` field."""
        given = (self.config.model_loading_config or {}).get("model_id")
        if given is not None:
            return str(given)
        return TINY_MODEL_ID if self.config.model_source is None else _model_id(self.config.model_source)


class AppArgs(ServeConfig):
    """The arguments of ``build_from_args``: a config file's keys without the `specserve serve` process's."""

    device: Literal["gpu", "cpu"] = Field(
        description="Where the engines run. Explicit because the builder runs on the head node, which may have no GPU."
    )

    @model_validator(mode="after")
    def _no_process_keys(self) -> AppArgs:
        if "server" in self.model_fields_set:
            raise ValueError(
                "server: not an application argument; set the address in the Serve config's http_options, the "
                "cluster's size and metrics port with `ray start`, and the API key as SPECSERVE_API_KEY in the head "
                "node's environment (Serve shows an application's args in plain text)"
            )
        return self


def model_pair(config: ServeConfig) -> tuple[Any, str | None]:
    """Target and draft as the engines load them: folders made absolute, Hugging Face ids and object storage as
    given, or the bundled tiny trained pair (built once, then cached)."""
    if config.model_source is None:
        return bundled_models(config.speculation.method)
    draft = config.speculation.draft
    return _located(config.model_source), None if draft is None else _located(draft)


def bundled_models(name: str) -> tuple[str, str | None]:
    """Target and draft for method ``name`` on the bundled tiny target (built once, then cached): its draft model;
    its EAGLE-3 head; for MTP the same target written as a MiMo model with one MTP layer; nothing for lookup.
    ConfigError for a method the bundled target has nothing for (``eagle``: EAGLE-1's head format)."""
    from specserve.models import cached_pair
    from specserve.models.cache import cached_head_paths

    m = method(name)
    pair = cached_pair("trained")
    if m.source is Source.DRAFT_MODEL:
        return str(pair.target), str(pair.draft)
    if m.source is Source.NONE:
        return str(pair.target), None
    if name in ("eagle3", "mtp"):
        paths = cached_head_paths(name)
        return str(paths.target), None if m.source is Source.TARGET else str(paths.head)
    raise ConfigError(
        f"speculation.method: {name}: the bundled tiny target has no head in that format; use eagle3 or mtp "
        "(bundled) or ngram, or set model_loading_config.model_source and speculation.draft for your own"
    )


def _located(source: Any) -> Any:
    if isinstance(source, str) and source.startswith(("s3://", "gs://", "abfss://", "azure://")):
        return {"bucket_uri": source}  # Ray Serve LLM's CloudMirrorConfig
    if isinstance(source, str) and (source.startswith(("/", ".", "~")) or Path(source).exists()):
        return str(Path(source).expanduser().resolve())
    return source


def has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve_serve(config: ServeConfig, scratch_dir: str | None = None) -> ResolvedServe:
    """The config resolved for the engines' device (the config's, else this machine's), checked by Ray Serve LLM's
    own model. ``scratch_dir``: where engines keep vLLM's caches (None: vLLM's own folders, for a deployment that
    outlives the process building it). Raises ConfigError."""
    target, draft = model_pair(config)
    device = config.configured_device
    on_gpu = device == "gpu" if device else has_gpu()
    try:
        check_engine_cpus(config.cpu.engine_cpus, config.tensor_parallel_size, config.cpu.executor, on_gpu)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    env = engine_env(
        scratch_dir,
        tp=config.tensor_parallel_size,
        kv_cache_space_gib=config.cpu.kv_cache_space_gib,
        cpu_threads=config.cpu.threads,
        engine_cpus=config.cpu.engine_cpus,
        on_gpu=on_gpu,
    )
    resolved = ResolvedServe(config, target, draft, on_gpu, env)
    llm_config(resolved)  # Ray Serve LLM's own checks, before anything starts
    return resolved


def deployment_config(config: ServeConfig, on_gpu: bool) -> dict[str, Any]:
    """The replicas' Ray Serve deployment options: the config's, with specserve's defaults where it is silent."""
    options = dict(config.deployment_config)
    if "num_replicas" not in options and "autoscaling_config" not in options:
        options["num_replicas"] = 1
    if not on_gpu:
        # On CPU the replica actor only relays requests to its engine process, which its placement bundle's one
        # CPU per rank already accounts for: Ray Serve LLM's default would add a CPU per replica, so two
        # replicas would not fit a 2-core machine.
        options.setdefault("ray_actor_options", {"num_cpus": 0})
    if "max_queued_requests" in options:
        # Ray Serve's own admission: past the queue bound its handle refuses at once (BackPressureError), which
        # the ingress answers with this status and Retry-After instead of letting latency grow without bound.
        options.setdefault(
            "backpressure_config",
            {"status_code": config.server.overload_status, "retry_after_s": config.server.retry_after_s},
        )
    return options


def llm_config_fields(resolved: ResolvedServe) -> dict[str, Any]:
    """The LLMConfig's fields, plain data (what `config render` prints), made speculative by the public API."""
    config = resolved.config
    loading = dict(config.model_loading_config or {})
    loading["model_source"] = resolved.target
    loading["model_id"] = resolved.model_id
    engine_kwargs = {**({} if resolved.on_gpu else CPU_ENGINE_DEFAULTS), **config.engine_kwargs}
    runtime_env = dict(config.runtime_env)
    runtime_env["env_vars"] = {**resolved.env_vars, **runtime_env.get("env_vars", {})}
    plain: dict[str, Any] = {
        "model_loading_config": loading,
        "engine_kwargs": engine_kwargs,
        "deployment_config": deployment_config(config, resolved.on_gpu),
        "runtime_env": runtime_env,
        "accelerator_config": config.accelerator_config or {"kind": "gpu" if resolved.on_gpu else "cpu"},
    }
    if config.placement_group_config is not None:
        plain["placement_group_config"] = _with_device(config.placement_group_config, resolved.on_gpu)
    for key in (
        "accelerator_type",
        "lora_config",
        "experimental_configs",
        "log_engine_metrics",
        "server_cls",
    ):
        if (value := getattr(config, key)) is not None:
            plain[key] = value
    options = config.speculation.model_dump(exclude={"draft"})
    return speculative_llm_config(plain, draft=resolved.draft, cpu=config.cpu, **options)


def _with_device(placement: dict[str, Any], on_gpu: bool) -> dict[str, Any]:
    """A bundle per rank that names only custom resources gets the rank's device too, as Ray Serve LLM's own
    bundle would hold it: one GPU, or one CPU."""
    bundle = placement.get("bundle_per_worker")
    if isinstance(bundle, dict) and not {"CPU", "GPU"} & set(bundle):
        return {**placement, "bundle_per_worker": {"GPU" if on_gpu else "CPU": 1.0, **bundle}}
    return placement


def _model_id(source: Any) -> str:
    # What clients send in the `model` field when the config names none: the source as written, as `vllm serve` does.
    return str(source.get("bucket_uri") if isinstance(source, dict) else source).rstrip("/")


def llm_config(resolved: ResolvedServe) -> Any:
    """The LLMConfig, checked by Ray Serve LLM's own model: a bad value there is a ConfigError naming its key."""
    from ray.serve.llm import LLMConfig

    try:
        return LLMConfig(**llm_config_fields(resolved))
    except ValidationError as exc:
        raise ConfigError(describe(exc, "configuration")) from None


def build_app(resolved: ResolvedServe, api_key: SecretStr | None = None) -> Any:
    """The OpenAI-compatible application (unstarted): /v1/models, /v1/completions, /v1/chat/completions."""
    key = api_key if api_key is not None else resolved.config.server.api_key
    return build_openai_app([llm_config(resolved)], api_key=key, retry_after_s=resolved.config.server.retry_after_s)


def build_openai_app(llm_configs: Any, *, api_key: Any = None, retry_after_s: float = 1.0) -> Any:
    """Ray Serve LLM's ``build_openai_app`` over ``llm_configs`` (made speculative by ``speculative_llm_config``)
    with specserve's hardened ingress: /v1/models, /v1/completions, /v1/chat/completions. Unstarted. ``api_key``
    None: the ingress reads SPECSERVE_API_KEY on the head node."""
    from ray.serve.llm import build_openai_app as build

    return build(openai_app_args(list(llm_configs), api_key=api_key, retry_after_s=retry_after_s))


def engine_path(on_gpu: bool) -> str:
    """The engine path the replicas run, in words, for `config render` and the logs."""
    if not on_gpu:
        return "vLLM's CPU runner (the V1 model runner; vLLM forces synchronous scheduling on CPU)"
    settings = ", ".join(
        [*(f"{k}={v}" for k, v in GPU_ENGINE_ENV.items()), *(f"{k}: {v}" for k, v in GPU_ENGINE_KWARGS.items())]
    )
    return f"vLLM's V1 model runner with synchronous scheduling ({settings}); checked at every engine start"


def serve_document(resolved: ResolvedServe) -> dict[str, Any]:
    """The Serve config file `serve deploy` takes for this application: Ray Serve LLM's ``build_openai_app`` with
    every LLMConfig value resolved. No API key (the ingress reads SPECSERVE_API_KEY on the head node)."""
    server = resolved.config.server
    fields = llm_config_fields(resolved)
    llm_config(resolved)  # checked by Ray Serve LLM's own model before it is printed
    return {
        "proxy_location": server.proxy_location,
        "http_options": {"host": server.host, "port": server.port},
        "applications": [
            {
                "name": "specserve",
                "route_prefix": "/",
                "import_path": "ray.serve.llm:build_openai_app",
                "args": openai_app_args([fields], retry_after_s=server.retry_after_s),
            }
        ],
    }


def memory_params(config: ServeConfig) -> Any:
    """The controller's cluster memory parameters from the speculation section."""
    from specserve.memory import ClusterMemoryParams

    return ClusterMemoryParams(
        max_concurrent_transfers=config.speculation.max_concurrent_reloads,
        min_resident_per_deployment=config.speculation.min_resident_drafts,
    )


def env_api_key() -> SecretStr | None:
    """SPECSERVE_API_KEY, checked as the serve command checks its key; None when unset or empty."""
    from specserve.cluster.sections import ServerOptions

    if not (value := os.environ.get("SPECSERVE_API_KEY")):
        return None
    return ServerOptions(api_key=value).api_key


def build_from_args(args: dict[str, Any]) -> Any:
    """Serve's application builder: ``import_path: specserve.cluster.app:build_from_args`` with ``args`` holding a
    config file's keys (``model_loading_config``, ``engine_kwargs``, ``speculation``, ...) and ``device``.

    Engines keep vLLM's own cache and temporary folders: nothing would delete a scratch folder after a deployment.
    Serve runs the builder inside the cluster (building joins it, as Ray Serve LLM's builder does), where it also
    makes sure the cluster has specserve's controller (each replica would also start it).
    """
    from specserve.controller.actor import get_or_create_controller

    try:
        config = AppArgs.model_validate(args)
    except ValidationError as exc:
        raise ConfigError(describe(exc, "args")) from None
    target, draft = model_pair(config)
    app = build_app(ResolvedServe(config, target, draft, on_gpu=config.device == "gpu", env_vars={}), env_api_key())
    # Named and detached: created once per cluster, found again by every later build.
    get_or_create_controller(memory_params(config))
    return app
