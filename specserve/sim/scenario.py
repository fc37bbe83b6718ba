"""Scenarios: load one by built-in name or YAML file, and resolve it against the profiles.

``resolve`` computes what the config only implies (per-GPU KV capacity, the step timer) into a separate
frozen object (house rule 6: derived values are never written back into the config).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import ValidationError

from specserve.sim.config import Scenario, StreamConfig, TraceArrivals
from specserve.sim.latency import LinearForward, StepTimer, roofline_timer
from specserve.sim.profiles import GIB, HardwareProfile, ModelProfile, PairProfile, ProfileError, lookup
from specserve.sim.proposer import Proposer, proposer_for
from specserve.speculation.methods import offload_refusal

BUILTIN_DIR = Path(__file__).resolve().parent / "scenarios"
_Stream = TypeVar("_Stream", bound=StreamConfig)


class ScenarioError(ValueError):
    """A scenario name, file or key is wrong; the message names it."""


def builtin_scenarios() -> dict[str, Path]:
    """Built-in scenario name -> file, sorted by name."""
    return {path.stem: path for path in sorted(BUILTIN_DIR.glob("*.yaml"))}


def load_scenario(ref: str) -> Scenario:
    """A built-in name or a path to a YAML file. A trace path is resolved against the file's folder."""
    builtins = builtin_scenarios()
    path = builtins.get(ref) or Path(ref)
    if not path.is_file():
        raise ScenarioError(f"unknown scenario {ref!r}: not a built-in ({', '.join(builtins)}) nor a file")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ScenarioError(f"scenario file {str(path)!r} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ScenarioError(f"scenario file {str(path)!r} must hold a mapping")
    raw.setdefault("name", path.stem)
    scenario = parse_scenario(raw, source=str(path))
    workload = _traces_from(scenario.workload, path.parent)
    if workload.batch is not None and (batch := _traces_from(workload.batch, path.parent)) is not workload.batch:
        workload = workload.model_copy(update={"batch": batch})
    return scenario if workload is scenario.workload else scenario.model_copy(update={"workload": workload})


def _traces_from(stream: _Stream, folder: Path) -> _Stream:
    arrivals = stream.arrivals
    if isinstance(arrivals, TraceArrivals) and not Path(arrivals.path).is_absolute():
        return stream.model_copy(update={"arrivals": TraceArrivals(kind="trace", path=str(folder / arrivals.path))})
    return stream


def parse_scenario(raw: dict, source: str = "<dict>") -> Scenario:
    try:
        return Scenario.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(part) for part in err["loc"]) or "(root)"
        raise ScenarioError(f"scenario {source!r}: {where}: {err['msg']}") from None


@dataclass(frozen=True, slots=True)
class ResolvedScenario:
    scenario: Scenario
    hardware: HardwareProfile
    pair: PairProfile
    target: ModelProfile
    # The draft model or head; None for a method without weights (a lookup).
    draft: ModelProfile | None
    tp: int
    # KV blocks per engine; a block holds block_size tokens of the target's and the draft's KV, since
    # vLLM gives the draft's layers the same block table.
    num_kv_blocks: int
    # Blocks the draft's weights would free if offloaded (Nightjar's N_draft, §6, Table 4).
    num_draft_weight_blocks: int
    # Bytes of one KV block on the GPU holding the draft (target's share under TP plus the draft's).
    kv_block_bytes: int
    timer: StepTimer
    # What the pair's method runs per step and at k = 0 (proposer.py).
    proposer: Proposer


def resolve(scenario: Scenario) -> ResolvedScenario:
    try:
        hardware = lookup("hardware", scenario.hardware)
        pair = lookup("pair", scenario.pair)
        target = lookup("model", pair.target)
        draft = lookup("model", pair.draft) if pair.draft is not None else None
    except ProfileError as exc:
        raise ScenarioError(f"scenario {scenario.name!r}: {exc}") from None
    proposer = proposer_for(pair.method, scenario.engine)
    if scenario.memory.offload and not proposer.method.offloadable:
        raise ScenarioError(f"scenario {scenario.name!r}: {offload_refusal(proposer.method)}")
    tp = scenario.tp or pair.tp
    draft_kv = draft.kv_bytes_per_token if draft is not None else 0
    block_bytes = scenario.engine.block_size * (target.kv_bytes_per_token / tp + draft_kv)
    num_blocks = scenario.engine.num_kv_blocks or _kv_blocks_from_memory(
        scenario, hardware, target, draft, tp, block_bytes
    )
    return ResolvedScenario(
        scenario=scenario,
        hardware=hardware,
        pair=pair,
        target=target,
        draft=draft,
        tp=tp,
        num_kv_blocks=num_blocks,
        num_draft_weight_blocks=math.ceil(draft.weight_bytes / block_bytes) if draft is not None else 0,
        kv_block_bytes=math.ceil(block_bytes),
        timer=_timer(scenario, hardware, pair, target, draft, tp),
        proposer=proposer,
    )


def _kv_blocks_from_memory(
    scenario: Scenario,
    hardware: HardwareProfile,
    target: ModelProfile,
    draft: ModelProfile | None,
    tp: int,
    block_bytes: float,
) -> int:
    # Per GPU of the TP group. The draft runs unsharded (draft TP 1, as in Nightjar's scripts), so the rank
    # holding it has the least room, and vLLM sizes every rank's cache to the smallest.
    engine = scenario.engine
    free_bytes = (
        hardware.memory_gib * GIB * engine.gpu_memory_utilization
        - engine.reserved_gib * GIB
        - target.weight_bytes / tp
        - (draft.weight_bytes if draft is not None else 0.0)
    )
    num_blocks = int(free_bytes // block_bytes)
    if num_blocks < 1:
        raise ScenarioError(
            f"scenario {scenario.name!r}: pair {scenario.pair!r} at tp={tp} leaves no KV memory on "
            f"{scenario.hardware!r} ({free_bytes / GIB:.1f} GiB)"
        )
    return num_blocks


def _timer(
    scenario: Scenario,
    hardware: HardwareProfile,
    pair: PairProfile,
    target: ModelProfile,
    draft: ModelProfile | None,
    tp: int,
) -> StepTimer:
    cfg = scenario.latency
    # A lookup's one search per step is priced by the pair's own fit, whatever the target's latency model.
    lookup_fit = LinearForward.from_fit(pair.lookup) if pair.lookup is not None else None
    if cfg.kind == "linear":
        fit = pair.linear.get(scenario.hardware)
        if fit is None:
            raise ScenarioError(
                f"scenario {scenario.name!r}: latency.kind 'linear' needs a fit for hardware "
                f"{scenario.hardware!r} in pair {scenario.pair!r}; have: {', '.join(pair.linear) or 'none'}"
            )
        if tp != pair.tp:
            raise ScenarioError(f"scenario {scenario.name!r}: the linear fit is for tp={pair.tp}, not tp={tp}")
        draft_fit = lookup_fit or (LinearForward.from_fit(fit.draft) if fit.draft is not None else None)
        if draft_fit is None:
            raise ScenarioError(
                f"scenario {scenario.name!r}: pair {scenario.pair!r} has no draft fit on {scenario.hardware!r}"
            )
        # The fitted intercepts already include the engine's per-step overhead.
        return StepTimer(LinearForward.from_fit(fit.target), draft_fit, 0.0)
    timer = roofline_timer(cfg, hardware, target, draft or target, tp)
    return replace(timer, draft=lookup_fit) if lookup_fit is not None else timer
