"""User-facing configuration of `specserve serve`, `config render` and `doctor`: Ray Serve LLM's vocabulary.

A config file is an ``LLMConfig`` (``model_loading_config``, ``engine_kwargs``, ``deployment_config``,
``runtime_env``, ``accelerator_type``, ``placement_group_config``, ...) plus specserve's sections:
``speculation`` (method, draft, policy, max_k, offload, ...), ``cpu`` (CPU engines only) and ``server`` (the
`specserve serve` process). Every vLLM engine argument in ``engine_kwargs`` passes through untouched except the few
that carry specserve's control into the engine (``specserve.llm.check_engine_kwargs``). The ``LLMConfig`` part is
checked by Ray Serve LLM's own model when the application is built (``config render`` builds it without starting
anything). Flags given on the command line override the file. Unknown keys are errors that name the key; the flat
keys of earlier releases are read, each with a note naming its new place.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from specserve.cluster.sections import CpuEngine, ServerOptions, Speculation, check_engine_cpus
from specserve.speculation.methods import method

# A Hugging Face id: "name" or "org/name" (vLLM resolves it on each node, HF_TOKEN from the node's environment).
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_CLOUD_PREFIXES = ("s3://", "gs://", "abfss://", "azure://")


class ServeConfig(BaseModel):
    """An ``LLMConfig`` plus specserve's ``speculation``, ``cpu`` and ``server`` sections."""

    # Errors leave the input out: pydantic would otherwise print the whole mapping, api_key included.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True, protected_namespaces=())

    model_loading_config: dict[str, Any] | None = Field(
        None,
        description="Ray Serve LLM's: `model_id` (the name clients send) and `model_source` (a Hugging Face id, a "
        "folder on the nodes that run replicas, or object storage: `s3://...`, `gs://...` or Ray's "
        "`{bucket_uri: ...}`). Default: the bundled tiny target on CPU.",
    )
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="vLLM engine arguments, passed through untouched (`max_model_len`, `gpu_memory_utilization`, "
        "`quantization`, `kv_cache_dtype`, `tensor_parallel_size`, ...), except the few specserve sets.",
    )
    deployment_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Ray Serve deployment options: `num_replicas` or `autoscaling_config` (with a "
        "`target_ongoing_requests`: without one, Ray Serve LLM's default of 10^9 never adds a replica), "
        "`max_ongoing_requests`, `max_queued_requests`, ...",
    )
    runtime_env: dict[str, Any] = Field(
        default_factory=dict, description="Ray runtime environment of the replicas and their engines."
    )
    accelerator_type: str | None = Field(None, description="Ray Serve LLM's accelerator type, e.g. `H100`.")
    accelerator_config: dict[str, Any] | None = Field(
        None, description="Ray Serve LLM's accelerator kind: `{kind: gpu}` or `{kind: cpu}`. Default: this machine's."
    )
    placement_group_config: dict[str, Any] | None = Field(
        None, description="Ray Serve LLM's placement: `bundle_per_worker` or `bundles`, and `strategy`."
    )
    lora_config: dict[str, Any] | None = Field(None, description="Ray Serve LLM's LoRA settings.")
    experimental_configs: dict[str, Any] = Field(
        default_factory=dict, description="Ray Serve LLM's experimental settings."
    )
    log_engine_metrics: bool | None = Field(None, description="Ray Serve LLM's: export vLLM's engine metrics.")
    server_cls: str | None = Field(
        None, description="A subclass of specserve's replica class, as an import path; default: specserve's."
    )
    speculation: Speculation = Field(default_factory=Speculation, description="How the replicas speculate.")
    cpu: CpuEngine = Field(default_factory=CpuEngine, description="CPU engines only.")
    server: ServerOptions = Field(default_factory=ServerOptions, description="The `specserve serve` process.")

    @property
    def model_source(self) -> Any:
        """The target as given (None: the bundled tiny target)."""
        loading = self.model_loading_config or {}
        return loading.get("model_source", loading.get("model_id"))

    @property
    def tensor_parallel_size(self) -> int:
        return int(self.engine_kwargs.get("tensor_parallel_size", 1))

    @property
    def num_replicas(self) -> int:
        """Replicas at start: ``num_replicas``, or the autoscaler's ``min_replicas`` (at least one)."""
        scaling = self.deployment_config.get("autoscaling_config")
        if isinstance(scaling, dict):
            return max(int(scaling.get("initial_replicas", scaling.get("min_replicas", 1)) or 1), 1)
        return int(self.deployment_config.get("num_replicas", 1))

    @property
    def configured_device(self) -> str | None:
        """``gpu`` or ``cpu`` where the config says, None where this machine decides."""
        kind = (self.accelerator_config or {}).get("kind")
        if kind is not None:
            return str(kind)
        return "gpu" if self.accelerator_type else None

    @model_validator(mode="after")
    def _engine_kwargs_pass(self) -> ServeConfig:
        from specserve.llm import check_engine_kwargs

        check_engine_kwargs(self.engine_kwargs)
        if self.server_cls is not None and "." not in self.server_cls:
            raise ValueError(f"server_cls {self.server_cls!r}: an import path, module.Class")
        return self

    @model_validator(mode="after")
    def _sources(self) -> ServeConfig:
        source, draft = self.model_source, self.speculation.draft
        if source is None and draft is not None:
            raise ValueError(
                "speculation.draft needs your target: set model_loading_config.model_source too, or neither for the "
                "bundled tiny pair"
            )
        needs_draft = method(self.speculation.method).needs_draft
        if source is not None and draft is None and needs_draft:
            raise ValueError(
                f"speculation.draft: required with your own target for method {self.speculation.method} (a Hugging "
                "Face id or a folder)"
            )
        if source is not None:
            check_source("model_loading_config.model_source", source, cloud=True)
            if draft is not None:
                check_source("speculation.draft", draft, cloud=False)
        return self

    @model_validator(mode="after")
    def _deployment(self) -> ServeConfig:
        deployment = self.deployment_config
        _whole("engine_kwargs.tensor_parallel_size", self.engine_kwargs.get("tensor_parallel_size", 1))
        _whole("deployment_config.num_replicas", deployment.get("num_replicas", 1))
        scaling = deployment.get("autoscaling_config")
        if scaling is not None:
            if not isinstance(scaling, dict):
                raise ValueError("deployment_config.autoscaling_config: expected a mapping of Ray Serve's keys")
            for key in ("min_replicas", "initial_replicas"):
                if scaling.get(key) is not None:
                    _whole(f"deployment_config.autoscaling_config.{key}", scaling[key], least=0)
        if "max_queued_requests" in deployment and "max_ongoing_requests" not in deployment:
            raise ValueError(
                "deployment_config.max_queued_requests needs max_ongoing_requests: without a bound on each replica no "
                "request ever waits in Ray Serve's queue (they all wait inside the engines)"
            )
        if self.speculation.min_resident_drafts > self.num_replicas:
            raise ValueError(
                f"speculation.min_resident_drafts={self.speculation.min_resident_drafts} is more than the "
                f"{self.num_replicas} replica(s) at start: no deployment could keep that many drafts resident"
            )
        try:
            check_engine_cpus(self.cpu.engine_cpus, self.tensor_parallel_size, self.cpu.executor)
        except ValueError as e:
            raise ValueError(f"cpu.{e}") from None
        return self


def _whole(key: str, value: Any, least: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{key}: {value!r}: expected a whole number of at least {least}")


def check_source(key: str, source: Any, *, cloud: bool) -> None:
    """A model source as Ray Serve LLM takes it: a folder holding a model, a Hugging Face id, or (``cloud``) object
    storage. Raises ValueError naming ``key``."""
    if isinstance(source, dict):
        if cloud and "bucket_uri" in source:
            return
        raise ValueError(f"{key}: expected a Hugging Face id, a folder or an s3:// / gs:// URI")
    text = str(source)
    if text.startswith(_CLOUD_PREFIXES):
        if cloud:
            return
        raise ValueError(
            f"{key}: {text!r}: vLLM loads a draft from a Hugging Face id or a folder on each node, not from object "
            "storage; copy it to the nodes or name its Hugging Face id"
        )
    if _is_folder(text):
        folder = Path(text).expanduser()
        # A folder missing here may be on the nodes that run the replicas (a disk of the GPU nodes'), where vLLM reads
        # it: the commands that load it on this machine ask for it (``folders_not_here``).
        if folder.exists() and not (folder / "config.json").is_file():
            raise ValueError(f"{key}: {text!r} is not a Hugging Face model folder (no config.json)")
        return
    if not _HF_ID.match(text):
        raise ValueError(f"{key}: {text!r} is neither a folder nor a Hugging Face id (org/name)")


def _is_folder(text: str) -> bool:
    return text.startswith(("/", ".", "~")) or Path(text).exists()


def folders_not_here(config: ServeConfig) -> list[tuple[str, str]]:
    """The model and draft folders ``config`` names that this machine does not have, as (key, folder)."""
    named = [
        ("model_loading_config.model_source", config.model_source),
        ("speculation.draft", config.speculation.draft),
    ]
    return [
        (key, str(source))
        for key, source in named
        if isinstance(source, str) and _is_folder(source) and not Path(source).expanduser().exists()
    ]


def require_folders_here(config: ServeConfig, why: str) -> None:
    """Raise ConfigError naming the first folder ``config`` names that is not on this machine; ``why``: what loads it
    here."""
    missing = folders_not_here(config)
    if missing:
        key, folder = missing[0]
        raise ConfigError(f"{key}: {folder!r}: no such folder on this machine, where {why}")


def note_folders_not_here(config: ServeConfig, command: str) -> None:
    """A line on stderr for each folder not on this machine: the replicas' nodes must have it."""
    for key, folder in folders_not_here(config):
        print(
            f"{command}: {key}: {folder!r} is not on this machine; every node that runs a replica must have it",
            file=sys.stderr,
        )


class ConfigError(ValueError):
    """A configuration problem, worded for the command line."""


# Where each flat key of earlier releases lives now ("section.key"); read with a note, this release only.
LEGACY_KEYS = {
    "model": "model_loading_config.model_source",
    "model_id": "model_loading_config.model_id",
    "k_max": "speculation.max_k",
    "replicas": "deployment_config.num_replicas",
    "tp": "engine_kwargs.tensor_parallel_size",
    "max_model_len": "engine_kwargs.max_model_len",
    "max_num_seqs": "engine_kwargs.max_num_seqs",
    "dtype": "engine_kwargs.dtype",
    "stream_interval": "engine_kwargs.stream_interval",
    "max_ongoing_requests": "deployment_config.max_ongoing_requests",
    "max_queued_requests": "deployment_config.max_queued_requests",
    "resources_per_rank": "placement_group_config.bundle_per_worker",
    "kv_cache_space_gib": "cpu.kv_cache_space_gib",
    "cpu_threads": "cpu.threads",
    "engine_cpus": "cpu.engine_cpus",
    "cpu_executor": "cpu.executor",
    **{key: f"speculation.{key}" for key in set(Speculation.model_fields) - {"max_k", "method"}},
    **{key: f"server.{key}" for key in ServerOptions.model_fields},
}


def migrate(data: dict[str, Any], where: str) -> dict[str, Any]:
    """A config with the flat keys of earlier releases moved to their sections, a note on stderr for each."""
    moved: dict[str, Any] = {key: value for key, value in data.items() if key not in LEGACY_KEYS}
    for key, value in data.items():
        if key in LEGACY_KEYS:
            print(f"{where}: {key}: now {LEGACY_KEYS[key]}; the old key is read this release only", file=sys.stderr)
            try:
                set_dotted(moved, LEGACY_KEYS[key], value)
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
    return moved


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """``data[a][b] = value`` for ``dotted`` "a.b", making the sections on the way; a key given twice: the last."""
    *sections, last = dotted.split(".")
    for section in sections:
        inner = data.get(section)
        if inner is None:
            inner = data[section] = {}
        elif not isinstance(inner, dict):
            raise ConfigError(f"{section}: expected a mapping of keys, got {type(inner).__name__}")
        data = inner
    data[last] = value


def load_config(path: str | None, overrides: dict[str, Any] | None = None) -> ServeConfig:
    """Merge a YAML file (if any) with command-line overrides (dotted keys, "speculation.max_k") and validate."""
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
                "\n".join(f"--config {path}: {key!r}: a key must be a name, such as speculation" for key in unnamed)
            )
        data = migrate(loaded or {}, f"--config {path}")
    for key, value in (overrides or {}).items():
        if value is not None:
            try:
                set_dotted(data, key, value)
            except ConfigError as exc:
                raise ConfigError(f"--config {path}: {exc}") from None
    return validate(data, path)


def validate(data: dict[str, Any], path: str | None = None) -> ServeConfig:
    try:
        return ServeConfig(**data)
    except ValidationError as exc:
        raise ConfigError(describe(exc, f"--config {path}" if path else "configuration")) from None


def _key_name(part: object) -> str:
    # A key that is blank, padded or holds control characters is quoted, so that the message shows it.
    text = str(part)
    return text if text and text.isprintable() and text.strip() == text else repr(part)


SECTIONS: dict[str, type[BaseModel]] = {"speculation": Speculation, "cpu": CpuEngine, "server": ServerOptions}


def describe(exc: ValidationError, where: str) -> str:
    lines = []
    for error in exc.errors():
        loc = [part for part in error["loc"] if not isinstance(part, int)]
        key = ".".join(_key_name(part) for part in loc)
        message = error["msg"].removeprefix("Value error, ")
        if not key:  # a check over several keys: its message names them
            lines.append(f"{where}: {message}")
            continue
        if error["type"] == "extra_forbidden":
            model = SECTIONS.get(str(loc[0]), ServeConfig) if len(loc) > 1 else ServeConfig
            message = f"unknown key; known keys: {', '.join(model.model_fields)}"
        lines.append(f"{where}: {key}: {message}")
    return "\n".join(lines)
