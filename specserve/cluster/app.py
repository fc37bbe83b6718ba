"""Build the Ray Serve application: Ray Serve LLM's OpenAI ingress over SpecLLMServer replicas.

Builders return unstarted applications: `cluster/local.py` runs them for `specserve serve`, and
``build_from_args`` is the application builder a Serve config file names (``serve run`` / ``serve deploy``).
The speculative part of every LLMConfig comes from the public ``specserve.speculative_llm_config``, so the
command line, Serve config files and users' own Ray Serve LLM code get the same replicas.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator

from specserve.cluster.config import ServeConfig
from specserve.llm import Speculation, speculative_llm_config
from specserve.messages import ON_HEAD_NODE

# ServeConfig keys about the `specserve serve` process and its local cluster; in a Serve config file the
# HTTP address and proxies belong in `http_options` and `proxy_location`, the cluster's size, metrics port and
# Serve's mode in `ray start` (its environment), and its Prometheus beside the cluster (deploy/prometheus/).
PROCESS_KEYS = (
    "host",
    "port",
    "proxy_location",
    "throughput_optimized",
    "haproxy",
    "metrics_port",
    "prometheus_port",
    "num_cpus",
    "engine_start_timeout_s",
)


@dataclass(frozen=True, slots=True)
class ResolvedServe:
    """Values derived from ServeConfig at start-up (never written back into it)."""

    config: ServeConfig
    target: str
    draft: str
    on_gpu: bool
    # Environment for every Ray worker that may host an engine (specserve.replicas.engine_env); variables
    # vLLM's CPU backend needs and the caller left out are added by speculative_llm_config.
    env_vars: dict[str, str]


class AppArgs(ServeConfig):
    """The arguments of ``build_from_args``: `specserve serve`'s config keys that describe the application."""

    device: Literal["gpu", "cpu"] = Field(
        description="Where the engines run. Explicit because the builder runs on the head node, which may have no GPU."
    )

    @model_validator(mode="after")
    def _no_process_keys(self) -> AppArgs:
        if "api_key" in self.model_fields_set:
            # Serve shows an application's args in plain text (`serve status`, the dashboard, its config dumps).
            raise ValueError(
                "api_key: not an application argument, where Serve would show it; export SPECSERVE_API_KEY on the "
                "head node before `ray start` instead"
            )
        if given := sorted(self.model_fields_set & set(PROCESS_KEYS)):
            raise ValueError(
                f"{', '.join(given)}: not an application argument; set the address in the Serve config's "
                "http_options, the cluster's size and metrics port with `ray start`, and Serve's throughput-optimized "
                "mode with RAY_SERVE_THROUGHPUT_OPTIMIZED=1 in `ray start`'s environment; a cluster's Prometheus "
                "runs beside it (deploy/prometheus/)"
            )
        return self


def model_pair(config: ServeConfig) -> tuple[str, str]:
    """Target and draft folders: the configured ones, or the bundled tiny trained pair (built once, then cached)."""
    if config.model is None or config.draft is None:  # the config allows both or neither
        from specserve.models import cached_pair

        pair = cached_pair("trained")
        return str(pair.target), str(pair.draft)
    return str(Path(config.model).resolve()), str(Path(config.draft).resolve())


def deployment_config(config: ServeConfig, on_gpu: bool) -> dict[str, Any]:
    """The replicas' Ray Serve deployment options: their number, size and admission bounds."""
    options: dict[str, Any] = {"num_replicas": config.replicas}
    if not on_gpu:
        # On CPU the replica actor only relays requests to its engine process, which its placement bundle's one
        # CPU per rank already accounts for: Ray Serve LLM's default would add a CPU per replica, so two
        # replicas would not fit a 2-core machine.
        options["ray_actor_options"] = {"num_cpus": 0}
    if config.max_ongoing_requests is not None:
        options["max_ongoing_requests"] = config.max_ongoing_requests
    if config.max_queued_requests is not None:
        # Ray Serve's own admission: past the queue bound its handle refuses at once (BackPressureError), which
        # the ingress answers with this status and Retry-After instead of letting latency grow without bound.
        options["max_queued_requests"] = config.max_queued_requests
        options["backpressure_config"] = {"status_code": config.overload_status, "retry_after_s": config.retry_after_s}
    return options


def llm_config(resolved: ResolvedServe) -> Any:
    """The LLMConfig a Ray Serve LLM user would write for this model, made speculative by the public API."""
    from ray.serve.llm import LLMConfig

    config = resolved.config
    placement: dict[str, Any] = {}
    if config.resources_per_rank:
        # Ray Serve LLM's own bundle per rank (one GPU, or one CPU) plus the custom resources; its default
        # strategy (PACK) still keeps a TP group on one node where one node can hold it.
        device = {"GPU": 1.0} if resolved.on_gpu else {"CPU": 1.0}
        placement["placement_group_config"] = {"bundle_per_worker": device | config.resources_per_rank}
    plain = LLMConfig(
        **placement,
        model_loading_config={"model_id": config.model_id, "model_source": resolved.target},
        accelerator_config={"kind": "gpu" if resolved.on_gpu else "cpu"},
        deployment_config=deployment_config(config, resolved.on_gpu),
        runtime_env={"env_vars": resolved.env_vars},
        engine_kwargs={
            "max_model_len": config.max_model_len,
            "max_num_seqs": config.max_num_seqs,
            "tensor_parallel_size": config.tp,
            # Explicit rather than vLLM's "auto" (bfloat16 by default), and a fixed seed: the tiny pair's outputs
            # and the benchmarks' numbers were taken with these.
            "dtype": config.dtype,
            "seed": 0,
            "stream_interval": config.stream_interval,
        },
    )
    options = config.model_dump(include=set(Speculation.model_fields) - {"draft"})
    return speculative_llm_config(plain, draft=resolved.draft, **options)


# Import path, not the class: Serve config files name it too, and the builder imports it where it runs.
INGRESS_CLS = "specserve.cluster.ingress:SpecServeIngress"


def build_app(resolved: ResolvedServe, api_key: SecretStr | None = None) -> Any:
    """The OpenAI-compatible application (unstarted): /v1/models, /v1/completions, /v1/chat/completions."""
    from ray.serve.llm import build_openai_app

    key = api_key if api_key is not None else resolved.config.api_key
    return build_openai_app(
        {
            "llm_configs": [llm_config(resolved)],
            # The key stays a SecretStr, masked in any repr Serve logs of the deployment's arguments.
            # retry_after_s: also the Retry-After of a 503 for a request whose engine died.
            "ingress_cls_config": {
                "ingress_cls": INGRESS_CLS,
                "ingress_extra_kwargs": {"api_key": key, "retry_after_s": resolved.config.retry_after_s},
            },
            # The ingress only routes: no CPU, which would starve the engines on small machines, and on the head
            # node, so that a worker node that fails takes only its own engines' requests with it.
            "ingress_deployment_config": {"ray_actor_options": {"num_cpus": 0, "resources": ON_HEAD_NODE}},
        }
    )


def memory_params(config: ServeConfig) -> Any:
    """The controller's cluster memory parameters from the serve config's keys."""
    from specserve.memory import ClusterMemoryParams

    return ClusterMemoryParams(
        max_concurrent_transfers=config.max_concurrent_reloads,
        min_resident_per_deployment=config.min_resident_drafts,
    )


def env_api_key() -> SecretStr | None:
    """SPECSERVE_API_KEY, checked as the serve command checks its key; None when unset or empty."""
    if not (value := os.environ.get("SPECSERVE_API_KEY")):
        return None
    return ServeConfig(api_key=value).api_key


def build_from_args(args: dict[str, Any]) -> Any:
    """Serve's application builder: ``import_path: specserve.cluster.app:build_from_args`` with ``args`` holding
    `specserve serve`'s config keys (model, draft, policy, k_max, replicas, tp, ...) and ``device``.

    Engines keep vLLM's own cache and temporary folders: nothing would delete a scratch folder after a deployment.
    Serve runs the builder inside the cluster (building joins it, as Ray Serve LLM's builder does), where it also
    makes sure the cluster has specserve's controller, as `specserve serve` does before it deploys: nothing else
    runs there that could start it.
    """
    from specserve.controller.actor import get_or_create_controller

    config = AppArgs.model_validate(args)
    target, draft = model_pair(config)
    app = build_app(ResolvedServe(config, target, draft, on_gpu=config.device == "gpu", env_vars={}), env_api_key())
    # Named and detached: created once per cluster, found again by every later build.
    get_or_create_controller(memory_params(config))
    return app
