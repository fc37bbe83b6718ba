"""Hardware, model, pair and dataset profiles: YAML data under ``profiles/`` read through pydantic schemas.

House rule 10: adding a GPU or a model is a data-only change. Each file maps a profile name to one entry;
unknown keys are errors that name the key (``extra="forbid"``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Literal, overload

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specserve.speculation.methods import method

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
# The methods the simulator models (sim/proposer.py): MTP (the target's own layers) and suffix decoding are not.
SIMULATED_METHODS = ("draft_model", "eagle", "eagle3", "ngram")
GIB = 1024**3


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HardwareProfile(_Closed):
    description: str = Field("", description="what the GPU is and where its figures come from")
    memory_gib: float = Field(gt=0, description="device memory per GPU")
    memory_bandwidth_gb_s: float = Field(gt=0, description="peak memory bandwidth, 1e9 bytes/s")
    peak_tflops: float = Field(gt=0, description="dense FP16/BF16 tensor peak, 1e12 FLOP/s")
    interconnect_gb_s: float = Field(gt=0, description="per-GPU all-reduce bus bandwidth, 1e9 bytes/s")
    allreduce_latency_s: float = Field(ge=0, description="fixed cost of one all-reduce call")
    host_to_device_gb_s: float = Field(
        gt=0, description="one pinned host-to-device copy (a draft reload), 1e9 bytes/s; shared by a node's copies"
    )


class ModelProfile(_Closed):
    description: str = ""
    params: float = Field(gt=0, description="total parameters")
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    dtype_bytes: int = Field(2, gt=0, description="bytes per weight and per KV element (2 for BF16/FP16)")

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        # K and V, every layer, every KV head.
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


class LinearFit(_Closed):
    """TurboSpec Eq. 3 (§4.1.3) for one forward pass."""

    s_per_context_token: float = Field(ge=0, description="KV read cost per cached token (alpha_kv)")
    s_per_batched_token: float = Field(ge=0, description="compute per token in the pass (gamma)")
    intercept_s: float = Field(ge=0, description="weights and fixed overhead (delta)")


class PairFit(_Closed):
    target: LinearFit
    draft: LinearFit | None = Field(None, description="one draft forward pass (a pair without weights has none)")


class PairProfile(_Closed):
    description: str = ""
    method: str = Field(
        "draft_model",
        description="speculative method (specserve.speculation.methods): draft_model, eagle, eagle3, mtp or ngram; "
        "what a k = 0 step runs and what the proposer costs follow from it (sim/proposer.py)",
    )
    target: str = Field(description="name in models.yaml")
    draft: str | None = Field(None, description="name in models.yaml; the draft model or head, none for a lookup")
    lookup: LinearFit | None = Field(
        None,
        description="a lookup method's one search per step (ngram): s_per_context_token over the running requests' "
        "tokens, s_per_batched_token per request searched, intercept_s per step",
    )
    tp: int = Field(1, gt=0, description="default tensor-parallel size of the target")
    linear: dict[str, PairFit] = Field(default_factory=dict, description="fitted latency per hardware name")


class LengthDistribution(_Closed):
    mean: float = Field(gt=0, description="mean tokens")
    std: float = Field(ge=0, description="standard deviation in tokens; 0 gives a constant")
    min_tokens: int = Field(1, ge=1)
    max_tokens: int = Field(4096, ge=1)


class DatasetProfile(_Closed):
    source: str = Field(description="where the statistics come from, or 'approximate'")
    prompt_tokens: LengthDistribution
    output_tokens: LengthDistribution


class ProfileError(ValueError):
    """A profile file or name is wrong; the message names the file, entry or key."""


def _load(file_name: str, schema: type[_Closed]) -> dict:
    path = PROFILE_DIR / file_name
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path.name} is not valid YAML: {exc}") from None
    out = {}
    for name, entry in raw.items():
        try:
            out[name] = schema.model_validate(entry)
        except ValidationError as exc:
            raise ProfileError(f"{path.name}: entry {name!r}: {_first_error(exc)}") from None
    return out


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(part) for part in err["loc"]) or "(root)"
    return f"{where}: {err['msg']}"


@cache
def hardware_profiles() -> dict[str, HardwareProfile]:
    return _load("hardware.yaml", HardwareProfile)


@cache
def model_profiles() -> dict[str, ModelProfile]:
    return _load("models.yaml", ModelProfile)


@cache
def pair_profiles() -> dict[str, PairProfile]:
    pairs = _load("pairs.yaml", PairProfile)
    models = model_profiles()
    for name, pair in pairs.items():
        if pair.method not in SIMULATED_METHODS:
            raise ProfileError(
                f"pairs.yaml: entry {name!r}: method {pair.method!r} is not simulated; "
                f"one of {', '.join(SIMULATED_METHODS)}"
            )
        needs_draft = method(pair.method).needs_draft
        if needs_draft != (pair.draft is not None) or needs_draft == (pair.lookup is not None):
            raise ProfileError(
                f"pairs.yaml: entry {name!r}: method {pair.method!r} needs "
                + ("a draft (and no lookup)" if needs_draft else "a lookup fit (and no draft)")
            )
        for role in ("target", "draft"):
            if getattr(pair, role) not in models and getattr(pair, role) is not None:
                raise ProfileError(f"pairs.yaml: entry {name!r}: {role} {getattr(pair, role)!r} is not in models.yaml")
    return pairs


@cache
def dataset_profiles() -> dict[str, DatasetProfile]:
    return _load("datasets.yaml", DatasetProfile)


@overload
def lookup(kind: Literal["hardware"], name: str) -> HardwareProfile: ...
@overload
def lookup(kind: Literal["pair"], name: str) -> PairProfile: ...
@overload
def lookup(kind: Literal["model"], name: str) -> ModelProfile: ...
@overload
def lookup(kind: Literal["dataset"], name: str) -> DatasetProfile: ...
def lookup(kind: str, name: str) -> _Closed:
    """One profile by kind ('hardware', 'pair', 'model', 'dataset') and name; the error lists known names."""
    tables: dict[str, Callable[[], Mapping[str, _Closed]]] = {
        "hardware": hardware_profiles,
        "pair": pair_profiles,
        "model": model_profiles,
        "dataset": dataset_profiles,
    }
    table = tables[kind]()
    if name not in table:
        raise ProfileError(f"unknown {kind} profile {name!r}; known: {', '.join(sorted(table))}")
    return table[name]
