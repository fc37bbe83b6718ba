"""The policy interface, the registry of policies by name, and ``NAME[:key=value,...]`` specs.

Contract: the engine calls ``choose(ctx)`` once per scheduler step, before the step runs, then
``observe(record)`` once the step's output is known. Both run on the engine's hot path, so they
must be cheap (microseconds) and must never block. A policy keeps its own explicit state. Where the
engine can end its draft loop early, the ``Decision`` may carry a ``DraftStop`` rule that the engine asks
after each draft pass; the rule holds that step's state, not the policy.
"""

from __future__ import annotations

import dataclasses
import types
import warnings
from abc import ABC, abstractmethod
from collections.abc import Container, Sequence
from typing import Any, ClassVar, get_args, get_type_hints

from specserve.speculation.types import Decision, EngineTraits, StepContext, StepRecord


class Policy(ABC):
    """Chooses the speculation length k for every engine step."""

    #: Registry key and the name users type on the command line.
    name: ClassVar[str]
    #: A frozen dataclass of the policy's parameters, with the papers' defaults.
    Params: ClassVar[type]

    def __init__(self, params: Any, traits: EngineTraits) -> None:
        self.params = params
        self.traits = traits

    @abstractmethod
    def choose(self, ctx: StepContext) -> Decision: ...

    def observe(self, record: StepRecord) -> None:  # noqa: B027 - stateless policies need nothing
        """Learn from a finished step. The default keeps no state."""

    def warm_start(self, history: Sequence[StepRecord]) -> None:
        """Learn from steps the engine ran before this policy took over, oldest first.

        An engine outlives its policies (``specserve policy set``), and what its steps cost and how often its
        drafts are accepted does not change with the policy that chose k: a policy that starts from the
        engine's measured steps instead of its prior does not spend its first minutes relearning them.
        Replaying ``observe`` is right for every policy that learns only from records; one that must not
        learn from another policy's steps overrides this.
        """
        for record in history:
            self.observe(record)

    def seed_acceptance(self, accepted: Sequence[float], reached: Sequence[float]) -> None:  # noqa: B027
        """Start from acceptance evidence gathered elsewhere: the decayed accepted and reached counts per draft
        position of peer replicas serving the same pair (the cluster controller's prior for a new replica).
        The default ignores it: only policies that keep a per-position acceptance estimate can use it."""

    def describe(self) -> dict[str, float]:
        """Numbers worth showing an operator (estimates, model fit); empty by default."""
        return {}

    @property
    def spec(self) -> str:
        """The canonical ``NAME[:key=value,...]`` string that rebuilds this policy."""
        return format_spec(self.name, self.params)


_REGISTRY: dict[str, type[Policy]] = {}
#: Names that point at another policy (``adaptive`` is the project default).
_ALIASES: dict[str, str] = {}
#: Policies that read what only the simulator knows, with the reason an engine cannot run them. The simulator
#: builds them itself; here they are only names, so that an engine, ``specserve serve --policy`` and ``policy set``
#: refuse them with that reason instead of "unknown policy".
SIMULATOR_ONLY: dict[str, str] = {
    "oracle": "it reads each request's true acceptance rate and the true step cost, which only the simulator has",
}
#: Parameters renamed in this release, old name -> new: a spec that uses the old name is read as the new one, with a
#: DeprecationWarning. Drop an entry one release after it was added.
RENAMED_PARAMETERS: dict[str, str] = {"k_max": "max_k"}


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make a policy selectable by its ``name``."""
    _REGISTRY[cls.name] = cls
    return cls


def alias(name: str, target: str) -> None:
    _ALIASES[name] = target


def policy_names() -> list[str]:
    return sorted({*_REGISTRY, *_ALIASES})


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``NAME[:key=value,...]`` into the name and raw string values."""
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    if not name:
        raise ValueError(f"empty policy name in {spec!r}")
    raw: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"policy parameter {item!r} in {spec!r} is not key=value")
        raw[key.strip()] = value.strip()
    return name, raw


def split_specs(text: str) -> list[str]:
    """Split a comma-separated list of specs on the commas that start a new policy.

    A piece with '=' but no ':' (``probe_k=1``) is another parameter of the spec before it:
    ``fixed:k=0,goodput:max_k=4,probe_k=1,adaptive`` -> ``fixed:k=0``, ``goodput:max_k=4,probe_k=1``, ``adaptive``.
    """
    specs: list[str] = []
    for piece in (part.strip() for part in text.split(",")):
        if not piece:
            raise ValueError(f"empty policy in {text!r}")
        if "=" in piece and ":" not in piece:
            if not specs:
                raise ValueError(f"policy parameter {piece!r} in {text!r} has no policy before it")
            specs[-1] = f"{specs[-1]},{piece}"
        else:
            specs.append(piece)
    return specs


def make_policy(spec: str, traits: EngineTraits) -> Policy:
    """Build a policy from ``NAME[:key=value,...]``; errors name the bad name, key or value."""
    name, raw = parse_spec(spec)
    if name in SIMULATOR_ONLY:
        raise ValueError(
            f"policy {name!r} runs only in the simulator: {SIMULATOR_ONLY[name]} (use it with `specserve sim compare` "
            "or `python -m lab leaderboard`)"
        )
    resolved = _ALIASES.get(name, name)
    if resolved not in _REGISTRY:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(policy_names())}")
    cls = _REGISTRY[resolved]
    params = build_params(cls, raw)
    return cls(params, traits)


def largest_k(max_k: int | None, traits: EngineTraits) -> int:
    """The largest k a policy searches: its ``max_k`` parameter capped by the engine's, or the engine's if unset."""
    return traits.max_k if max_k is None else min(max_k, traits.max_k)


def build_params(cls: type[Policy], raw: dict[str, str]) -> Any:
    """``cls.Params`` from raw ``key=value`` strings; errors name the bad key or value.

    Every spec reaches its parameters here (``make_policy`` and the simulator's own policies), so parameters
    renamed in ``RENAMED_PARAMETERS`` are read under their old name here and nowhere else.
    """
    fields = {f.name: f for f in dataclasses.fields(cls.Params)}
    hints = get_type_hints(cls.Params)
    values: dict[str, Any] = {}
    for key, text in _renamed(cls.name, raw, fields).items():
        if key not in fields:
            raise ValueError(f"policy {cls.name!r} has no parameter {key!r}; known: {', '.join(fields)}")
        values[key] = _convert(cls.name, key, text, hints[key])
    try:
        return cls.Params(**values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"policy {cls.name!r}: {exc}") from exc


def _renamed(policy: str, raw: dict[str, str], fields: Container[str]) -> dict[str, str]:
    """``raw`` with the old names of renamed parameters this policy has replaced by their new names."""
    out = dict(raw)
    for old, new in RENAMED_PARAMETERS.items():
        if old not in out or new not in fields:
            continue
        if new in out:
            raise ValueError(f"policy {policy!r}: {old} is the old name of {new}; give {new} only")
        warnings.warn(
            f"policy {policy!r}: {old} is now {new}; the old name is read this release only",
            DeprecationWarning,
            stacklevel=4,  # the caller of make_policy
        )
        out[new] = out.pop(old)
    return out


def _convert(policy: str, key: str, text: str, kind: Any) -> Any:
    if isinstance(kind, types.UnionType):  # ``int | None``: a given value is the type besides None
        (kind,) = (arg for arg in get_args(kind) if arg is not type(None))
    try:
        if kind is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        return kind(text)
    except (TypeError, ValueError):
        kind_name = getattr(kind, "__name__", kind)
        raise ValueError(f"policy {policy!r}: {key}={text!r} is not a valid {kind_name}") from None


def format_spec(name: str, params: Any) -> str:
    """``NAME[:key=value,...]`` naming only the parameters that differ from their defaults."""
    items = [
        f"{f.name}={getattr(params, f.name)}"
        for f in dataclasses.fields(params)
        if f.default is dataclasses.MISSING or getattr(params, f.name) != f.default
    ]
    return f"{name}:{','.join(items)}" if items else name
