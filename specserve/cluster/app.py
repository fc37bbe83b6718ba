"""Build the Ray Serve application: Ray Serve LLM's OpenAI ingress over SpecLLMServer replicas.

Builders return unstarted applications; `cluster/local.py` runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specserve.cluster.config import ServeConfig
from specserve.replicas.engine_args import DraftOffload, EngineSpec, speculative_engine_kwargs


@dataclass(frozen=True, slots=True)
class ResolvedServe:
    """Values derived from ServeConfig at start-up (never written back into it)."""

    config: ServeConfig
    target: str
    draft: str
    on_gpu: bool
    # Environment for every Ray worker that may host an engine (specserve.replicas.engine_env).
    env_vars: dict[str, str]


def llm_config(resolved: ResolvedServe) -> Any:
    from ray.serve.llm import LLMConfig

    from specserve.replicas.engine import CPU_EXECUTOR_KEY
    from specserve.replicas.server import SpecLLMServer

    config = resolved.config
    kwargs = speculative_engine_kwargs(
        EngineSpec(
            target=resolved.target,
            draft=resolved.draft,
            policy=config.policy,
            max_k=config.k_max,
            max_model_len=config.max_model_len,
            max_num_seqs=config.max_num_seqs,
            tensor_parallel_size=config.tp,
            enforce_eager=not resolved.on_gpu,
            skip_k0_draft_pass=config.skip_k0_draft_pass,
            policy_modules=config.policy_modules,
            draft_offload=(
                DraftOffload(config.offload_low_free_ratio, config.offload_window_steps)
                if config.draft_offload
                else None
            ),
        )
    )
    kwargs.pop("model")  # Ray Serve LLM takes the model from model_loading_config
    return LLMConfig(
        model_loading_config={"model_id": config.model_id, "model_source": resolved.target},
        accelerator_config={"kind": "gpu" if resolved.on_gpu else "cpu"},
        deployment_config={"num_replicas": config.replicas},
        runtime_env={"env_vars": resolved.env_vars},
        server_cls=SpecLLMServer,
        engine_kwargs=kwargs,
        experimental_configs={CPU_EXECUTOR_KEY: config.cpu_executor},
    )


def build_app(resolved: ResolvedServe) -> Any:
    """The OpenAI-compatible application (unstarted): /v1/models, /v1/completions, /v1/chat/completions."""
    from ray.serve.llm import build_openai_app

    return build_openai_app(
        {
            "llm_configs": [llm_config(resolved)],
            # The ingress only routes; giving it a CPU would starve the engines on small machines.
            "ingress_deployment_config": {"ray_actor_options": {"num_cpus": 0}},
        }
    )
