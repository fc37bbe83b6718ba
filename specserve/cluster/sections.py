"""The sections specserve adds to Ray Serve LLM's ``LLMConfig``: ``speculation``, ``cpu`` and ``server``.

One model per section, used by the config file (``cluster/config.py``), the command line's shorthands and the public
Python API (``specserve.llm``) alike, so that a key has one name and one check everywhere. No Ray or vLLM import.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from specserve.replicas.cpu_affinity import parse_cpu_list
from specserve.speculation import EngineTraits, make_policy

#: The speculative methods specserve controls. Other methods of vLLM's ``speculative_config`` are refused by name.
METHODS = ("draft_model",)


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
        description="Speculative method: `draft_model`, a separate draft model sharing the target's tokenizer.",
    )
    draft: str | None = Field(
        None,
        description="Draft model: a Hugging Face id (resolved by vLLM on each node) or a folder. Required with your "
        "own target; default: the bundled tiny draft with the bundled tiny target.",
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


class ServerOptions(BaseModel):
    """The `specserve serve` process and its local cluster: the ``server:`` section. A Serve config file sets these
    in Serve's own keys (``http_options``, ``proxy_location``) and in ``ray start``'s flags and environment."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    host: str = Field("127.0.0.1", description="Address the HTTP ingress binds.")
    port: int = Field(8000, ge=1, le=65535, description="Port of the OpenAI-compatible HTTP endpoint.")
    api_key: SecretStr | None = Field(
        None,
        description="Bearer token every request must carry (`Authorization: Bearer KEY`); default: none, the "
        "endpoint is open. Prefer SPECSERVE_API_KEY in the environment, which no file or `ps` shows.",
    )
    proxy_location: Literal["EveryNode", "HeadOnly"] = Field(
        "EveryNode",
        description="Where Ray Serve runs HTTP proxies: on every node (Serve's default, for a load balancer in front) "
        "or on the head only. A new Serve instance only: a cluster already running Serve keeps its proxies.",
    )
    throughput_optimized: bool = Field(
        False,
        description="Ray Serve's throughput-optimized mode on the local cluster (RAY_SERVE_THROUGHPUT_OPTIMIZED=1). "
        "A joined cluster takes it from the environment its nodes were started with.",
    )
    haproxy: bool = Field(
        False,
        description="Ray Serve's HAProxy ingress on the local cluster (RAY_SERVE_ENABLE_HA_PROXY=1). A joined cluster "
        "takes it from its nodes' environment.",
    )
    metrics_port: int = Field(
        8080, ge=1, le=65535, description="Ray's Prometheus metrics export port (local cluster only)."
    )
    prometheus_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Start a Prometheus (Debian's `prometheus`) on this port, scraping the local cluster's metrics "
        "port, its data in serve's temporary folder. Local cluster only; default: none.",
    )
    num_cpus: int | None = Field(
        None, ge=1, description="CPUs of the local Ray cluster. Default: this machine's, at least what engines need."
    )
    overload_status: Literal[429, 503] = Field(503, description="HTTP status of a request refused as overload.")
    retry_after_s: float = Field(
        1.0,
        ge=0,
        allow_inf_nan=False,
        description="Retry-After, seconds, of a request refused as overload or whose engine died.",
    )
    engine_start_timeout_s: float = Field(600.0, gt=0, description="How long `serve` waits for the endpoint to answer.")

    @field_validator("api_key")
    @classmethod
    def _key_is_a_token(cls, key: SecretStr | None) -> SecretStr | None:
        # The message never holds the key: it is printed.
        if key is not None:
            value = key.get_secret_value()
            if not value or any(c.isspace() or not c.isprintable() for c in value):
                raise ValueError("must be a non-empty token without spaces or control characters")
        return key
