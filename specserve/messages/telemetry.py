"""What an engine reports about itself: ``EngineTelemetry``, one frozen snapshot per owner, and the replica's
``ReplicaSnapshot`` around it.

Each part is produced by the object that owns its numbers and by nobody else, so a new number is declared in its
part and filled by its owner, never copied by name through a second list; counters are counted through ``Counts``,
whose attributes are their snapshot's fields:

    PolicySnapshot        the scheduler's policy (spec, k, its own report, the guard's error counts)
    LoadSnapshot          the scheduler's batch, queue and KV block pool
    SpeculationCounters   the scheduler's ``StepCounters.snapshot()`` (replicas/core/telemetry.py)
    AcceptanceEstimate    the telemetry's acceptance estimator, the same whatever the policy
    DraftMemorySnapshot   ``ElasticDraft.snapshot()`` (replicas/draft_memory/elastic_draft.py); None without a draft
    CollapseSnapshot      ``CollapseAction.snapshot()`` (replicas/core/collapse_action.py); None without a draft
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from specserve.speculation.collapse import CollapseState

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_Snapshot = TypeVar("_Snapshot", bound="DataclassInstance")


class DraftState(Enum):
    """Where an engine's draft weights are (Nightjar §6): the residency machine's states (``memory/residency.py``),
    the status DRAFT column and the ``specserve_draft_state`` metric's label.

    ``OFFLOADING`` exists in the pure machine only: the engine drops the draft and grows its pool between two steps,
    so no read ever sees it."""

    RESIDENT = "resident"
    OFFLOADING = "offloading"
    # The KV pool grown into the draft's bytes; the engine runs k = 0.
    OFFLOADED = "offloaded"
    # The grown blocks draining or migrating before the pool is cut back and the draft reloads.
    CONTRACTING = "contracting"
    # The pool back at its baseline, the draft being rebuilt while steps go on at k = 0.
    RELOADING = "reloading"


@dataclass(frozen=True, slots=True)
class PolicySnapshot:
    """The policy that chooses k, as the scheduler runs it."""

    # Canonical spec of the running policy, e.g. "goodput:max_k=4,...": `specserve status` shows it and
    # `policy set` callers poll it to see a switch land.
    spec: str
    # The k chosen for the most recent step: the status K column and the speculation_k gauge.
    k: int
    # Largest k the engine was started with: `policy set` validates a spec against it before sending.
    max_k: int
    # Whatever the policy reports about itself (estimates, fitted model, probe counts), for `status --json` and
    # for tests that check a policy's inner state.
    info: dict[str, float]
    # Policy failures the engine's guard absorbed (the step ran at k = 0), cumulative, by where: choose, observe,
    # bad_k (an answer outside 0..max_k), describe (``speculation/guard.py``).
    errors: dict[str, int] = dataclasses.field(default_factory=dict)
    # The engine's speculative method (``specserve.speculation.methods``) and what its k = 0 does there: the status
    # METHOD column, and the method label of the speculation metrics.
    method: str = "draft_model"
    k0: str = ""


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """The load behind the k choice, at the moment of the read."""

    # Requests in the decode batch and in the admission queue.
    num_running: int
    num_waiting: int
    # The target's KV block pool: capacity left for new requests and for speculative lookahead. While the draft is
    # offloaded the pool holds its bytes as extra blocks (``DraftMemorySnapshot.baseline_blocks`` is the size
    # without them).
    num_kv_blocks_total: int
    num_kv_blocks_free: int


@dataclass(frozen=True, slots=True)
class SpeculationCounters:
    """What the engine's steps did, cumulative since the engine started (or since its start-up calibration ended),
    so any number of readers take deltas without disturbing each other: ``StepCounters.snapshot()``, whose counters
    are these fields (``Counts``)."""

    # Steps run so far. Also the reader's cursor for ``EngineTelemetry.step_durations_s``.
    num_steps: int = 0
    # Output tokens the engine's steps produced: tokens/s by delta.
    num_emitted_tokens: int = 0
    # Steps run at each k, 0..max_k: shows where a policy settles and that a switch took effect.
    num_steps_by_k: tuple[int, ...] = ()
    # Per draft position: drafts verified, drafts whose whole prefix was accepted (the acceptance denominator when
    # k varies), drafts accepted. Positions 0..max_k-1.
    num_drafted_per_pos: tuple[int, ...] = ()
    num_reached_per_pos: tuple[int, ...] = ()
    num_accepted_per_pos: tuple[int, ...] = ()
    # Prefill tokens the step contexts announced to the policy, summed over steps: checks that the policy sees the
    # load the scheduler really runs (an offline batch at max_num_seqs announces none).
    num_prefill_tokens_announced: int = 0
    # Draft lists the policy's per-request caps cut shorter than the step's k before verification.
    num_drafts_capped: int = 0
    # k = 0 decode steps that ran without the draft's forward pass (0 where the engine does not skip it).
    num_steps_draft_skipped: int = 0
    # Draft lists cut to nothing before verification because the request's draft KV has a hole left by skipped
    # passes: such a request drafts again once a later pass has caught its draft KV up.
    num_drafts_cut_for_lag: int = 0
    # Draft lists cut before verification to the prefix the policy's confidence rule keeps (``Decision.draft_stop``
    # read position by position on the drafts' confidences; ``speculation/confident_prefix.py``).
    num_drafts_cut_by_confidence: int = 0
    # Draft lists the scheduler received from the worker (one per request per drafting step), and those that came
    # with the draft's confidences: the start-up check ``draft_signals`` reads them.
    num_draft_lists: int = 0
    num_draft_lists_with_signals: int = 0
    # Requests whose missed tokens a draft pass prepended (catch-up after skipped passes), and those tokens.
    num_requests_caught_up: int = 0
    num_catch_up_tokens: int = 0
    # Seconds the policy spent in choose and observe, summed over steps: what adaptive control costs the engine,
    # as a share of step time (the policy_seconds_total metric over step_duration_seconds_sum).
    policy_s: float = 0.0
    # The same calls' CPU seconds on the EngineCore's thread: below policy_s by the time other processes held the
    # core while the policy ran (on a small CPU host, vLLM's worker threads).
    policy_cpu_s: float = 0.0


@dataclass(frozen=True, slots=True)
class AcceptanceEstimate:
    """The telemetry's own acceptance estimator (an EMA per draft position), the same whatever the policy, so
    operators can compare policies on it. Positions 0..max_k-1."""

    # The conditional acceptance rate per position.
    per_pos: tuple[float, ...]
    # Its evidence: decayed accepted and reached counts per position. The controller averages them over a
    # deployment's replicas into a new replica's prior.
    accepted_per_pos: tuple[float, ...] = ()
    reached_per_pos: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class DraftTransfers:
    """What moving the draft has cost, cumulative: ``ElasticDraft``'s ``MemoryCounters.snapshot()``."""

    # Draft transfers by direction (count, seconds, bytes) and failed reloads: the transfer metrics, and the
    # controller's measure of a node's host-to-device bandwidth (reloaded bytes over reload seconds).
    num_offloads: int = 0
    num_reloads: int = 0
    num_reload_failures: int = 0
    offload_s: float = 0.0
    reload_s: float = 0.0
    bytes_offloaded: int = 0
    bytes_reloaded: int = 0
    # Contractions' block migrations: live blocks moved out of the grown region, and the seconds they took.
    blocks_migrated: int = 0
    migrate_s: float = 0.0


@dataclass(frozen=True, slots=True)
class DraftMemorySnapshot:
    """Elastic draft memory (``replicas/draft_memory/``): where the draft is, what its triggers want, what its
    transfers cost (``ElasticDraft.snapshot()``)."""

    # The status DRAFT column and the specserve_draft_state metric.
    state: DraftState
    # The pool's size with the draft resident, and the draft's bytes at the engine's dtype (0: unknown, so it is
    # never offloaded).
    baseline_blocks: int
    draft_bytes: int
    # Nightjar's triggers (``draft_offload``): what the engine wants and has been granted, why it is where it is
    # (the residency machine's own words, with its numbers), and whether a controller grants (true) or the engine
    # grants itself (false: no controller, local rules).
    offload_wanted: bool = False
    offload_granted: bool = False
    reload_wanted: bool = False
    reload_granted: bool = False
    reason: str = ""
    coordinated: bool = False
    transfers: DraftTransfers = DraftTransfers()


@dataclass(frozen=True, slots=True)
class CollapseSnapshot:
    """The acceptance-collapse machine (``speculation/collapse.py``) and what it did: its fields are named so that
    `status --json` prints them under the same names (no other part has them)."""

    # healthy, collapsed (k forced to 0), restoring (the draft rebuilt from its source), probing: the status
    # COLLAPSE column and the specserve_acceptance_collapse_state metric.
    collapse_state: CollapseState = CollapseState.HEALTHY
    # Cumulative: collapses detected (the specserve_acceptance_collapses_total metric), restores of the draft that
    # finished, probes that found acceptance still under the floor.
    num_collapses: int = 0
    num_collapse_restores: int = 0
    num_collapse_probes_failed: int = 0
    # The latest transition's reason, with its numbers, and when it happened (Unix seconds; 0: none yet).
    collapse_last_action: str = ""
    collapse_last_action_s: float = 0.0
    # When the latest collapse was detected (Unix seconds; 0: never): speculation is off from the next step.
    collapse_detected_s: float = 0.0
    # The detector's baseline first-position acceptance (None until established) and the floor a collapse is
    # below (None while the detector is unarmed: a draft poor from the start never arms it).
    collapse_baseline: float | None = None
    collapse_floor: float | None = None
    # Why this engine cannot rebuild its draft from its source ("" where it can).
    collapse_restore_refusal: str = ""


@dataclass(frozen=True, slots=True)
class EngineTelemetry:
    """One read of an engine's state, taken between two steps; a read changes nothing in the engine.

    It crosses vLLM's EngineCore utility call as ``to_dict()`` (msgpack: plain types only) and is rebuilt with
    ``from_dict``; ``flat()`` is the one-level view `specserve status --json` prints."""

    policy: PolicySnapshot
    load: LoadSnapshot
    speculation: SpeculationCounters
    acceptance_ema: AcceptanceEstimate
    # Wall times of the steps after the step count the reader asked from (its cursor), oldest first, for the
    # step-duration histogram: the last one is step ``speculation.num_steps``. The engine keeps only the most
    # recent ones, so a reader that falls far behind gets fewer than ``num_steps - cursor``. Not a counter: it
    # depends on the reader, so it sits beside the snapshots rather than in one.
    step_durations_s: tuple[float, ...] = ()
    # None where the engine does not speculate: it has no draft whose memory could move.
    draft_memory: DraftMemorySnapshot | None = None
    # Start-up checks that failed on this engine (``speculation/startup_checks.py``): it then serves under the
    # fallback policy. `specserve status` shows them and the startup_check_failed metric counts them.
    failed_checks: tuple[str, ...] = ()
    # The acceptance-collapse machine; None where the engine does not speculate.
    collapse: CollapseSnapshot | None = None

    @property
    def acceptance(self) -> float | None:
        """Position-0 EMA acceptance, the headline number operators compare with papers; None until a draft has
        been verified (the estimator's prior is not a measurement)."""
        reached = self.speculation.num_reached_per_pos
        if not reached or reached[0] == 0:
            return None
        return self.acceptance_ema.per_pos[0]

    @property
    def draft_state(self) -> DraftState | None:
        """Where the draft is; None without speculation."""
        return self.draft_memory.state if self.draft_memory is not None else None

    def to_dict(self) -> dict[str, Any]:
        """Plain types only (enums by value): vLLM's utility call serialises results with msgpack."""
        return _plain(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineTelemetry:
        return _decode(cls, data)

    def flat(self) -> dict[str, Any]:
        """Every field one level deep, under the names `specserve status --json` has always printed: a field
        keeps its own name unless ``FLAT_NAMES`` gives the older one. Without a draft, ``draft_state`` and
        ``collapse_state`` are "none"."""
        out = _flatten(self, "")
        if self.draft_memory is None:
            out["draft_state"] = "none"
        if self.collapse is None:
            out["collapse_state"] = "none"
        return out


#: (part, field) -> the key ``EngineTelemetry.flat`` prints it under: the names `status --json` had when the
#: telemetry was one flat record, kept so that scripts reading it go on working.
FLAT_NAMES = {
    ("policy", "spec"): "policy",
    ("policy", "info"): "policy_info",
    ("policy", "errors"): "policy_errors",
    ("acceptance_ema", "per_pos"): "acceptance_ema_per_pos",
    ("acceptance_ema", "accepted_per_pos"): "acceptance_ema_accepted_per_pos",
    ("acceptance_ema", "reached_per_pos"): "acceptance_ema_reached_per_pos",
    ("draft_memory", "state"): "draft_state",
    ("draft_memory", "baseline_blocks"): "num_kv_blocks_baseline",
    ("draft_memory", "reason"): "memory_reason",
    ("draft_memory", "coordinated"): "memory_coordinated",
}


@dataclass(frozen=True, slots=True)
class ReplicaSnapshot:
    """What a replica pushes to the controller about once a second."""

    # Ray Serve's replica id: the controller's key and the `policy set --replica` argument.
    replica_id: str
    # Ray node the replica runs on: the status NODE column, to see how replicas spread.
    node_id: str
    # The OpenAI model name the replica serves, for `status --json` when several models are deployed.
    model_id: str
    engine: EngineTelemetry
    # With `controller_batching: auto`, whether the replica pushes through its node's agent now (the controller
    # answers a BatchingDirective where the cluster's size wants the other way); None in the fixed modes.
    batching_node: bool | None = None


class Counts(Generic[_Snapshot]):
    """The mutable side of a snapshot of counters: one attribute per field of the frozen snapshot class, starting at
    the field's default (a tuple as an empty list, to count per position in), and ``snapshot()`` to freeze them.

    So a counter is declared once, in its snapshot, where its readers find what it means; its owner counts it as an
    attribute (``counts.num_steps += 1``). A subclass may keep more (declared as class annotations); any other name
    is refused at its first write, so a misspelt counter fails where it is counted instead of never being reported.
    """

    _snapshot_class: type[_Snapshot]
    # The names an instance may set: the snapshot's fields and the annotations of this class and its subclasses.
    _names: frozenset[str]

    def __init__(self, snapshot_class: type[_Snapshot]) -> None:
        names = {f.name for f in dataclasses.fields(snapshot_class)}
        names |= {name for klass in type(self).__mro__ for name in getattr(klass, "__annotations__", {})}
        object.__setattr__(self, "_snapshot_class", snapshot_class)
        object.__setattr__(self, "_names", frozenset(names))
        for f in dataclasses.fields(snapshot_class):
            if f.default is dataclasses.MISSING:
                raise TypeError(f"{snapshot_class.__name__}.{f.name} has no default to start counting from")
            setattr(self, f.name, list(f.default) if isinstance(f.default, tuple) else f.default)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._names:
            raise AttributeError(
                f"{type(self).__name__} counts no {name!r}: declare it in {self._snapshot_class.__name__}"
            )
        object.__setattr__(self, name, value)

    if TYPE_CHECKING:
        # The counters are the snapshot's fields, found at run time: each reads as the snapshot declares it.
        def __getattr__(self, name: str) -> Any: ...

    def snapshot(self) -> _Snapshot:
        """The counts as they stand, frozen (lists into tuples): one consistent read between two steps."""
        fields = dataclasses.fields(self._snapshot_class)
        return self._snapshot_class(**{f.name: _frozen(getattr(self, f.name)) for f in fields})

    def values(self) -> dict[str, Any]:
        """Every count and whatever else the subclass keeps, by name, as they stand."""
        return {name: value for name, value in vars(self).items() if not name.startswith("_")}


def _flatten(value: Any, part: str) -> dict[str, Any]:
    """A snapshot's fields one level deep, nested snapshots' fields among them, named by ``FLAT_NAMES``."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(value):
        item = getattr(value, f.name)
        if dataclasses.is_dataclass(item):
            out |= _flatten(item, f.name)
        else:
            out[FLAT_NAMES.get((part, f.name), f.name)] = _plain(item)
    return out


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _decode(cls: type[Any], data: dict[str, Any]) -> Any:
    """``cls`` rebuilt from ``_plain``'s output, by its field types: nested snapshots, enums, and tuples (msgpack
    turns them into lists; the snapshots hold tuples so they stay hashable and compare equal)."""
    hints = typing.get_type_hints(cls)
    return cls(
        **{f.name: _decode_value(hints[f.name], data[f.name]) for f in dataclasses.fields(cls) if f.name in data}
    )


def _decode_value(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(hint, types.UnionType):  # X | None
        (hint,) = (h for h in typing.get_args(hint) if h is not type(None))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _decode(hint, value)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return hint(value)
    return tuple(value) if isinstance(value, list) else value
