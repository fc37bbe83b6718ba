"""Where specserve replaces a vLLM symbol, and how: one ``replace`` per patch site, run by an ``install()``.

Every module that patches vLLM names what it replaces in a ``TARGETS`` tuple of ``"module:Qualified.name"`` strings
and puts its replacements in place only when its ``install()`` runs: the worker's when vLLM resolves the worker
extension (``worker/extension.py``), EngineCore's when the scheduler starts (``core/scheduler.py``). Importing a
module patches nothing; ``tests/unit/test_vllm_surface.py`` checks both that and that every target exists at the
pinned vLLM (0.32.0).
"""

from __future__ import annotations

import importlib
from typing import Any

# What each replaced target held before specserve's replacement: a second install finds it here.
_ORIGINALS: dict[str, Any] = {}


def resolve(target: str) -> tuple[Any, str]:
    """``"pkg.module:Class.attr"`` -> (the object holding the attribute, its name)."""
    module, _, path = target.partition(":")
    owner: Any = importlib.import_module(module)
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    return owner, name


def replace(target: str, replacement: Any) -> Any:
    """Put ``replacement`` at ``target`` once per process and return what it replaced (vLLM's own)."""
    if target not in _ORIGINALS:
        owner, name = resolve(target)
        _ORIGINALS[target] = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        setattr(owner, name, replacement)
    return _ORIGINALS[target]


def add(owner: Any, name: str, method: Any) -> None:
    """Give a vLLM class a method of specserve's (an EngineCore utility); refuses to shadow one of vLLM's."""
    existing = getattr(owner, name, None)
    if existing is not None and existing is not method:
        raise RuntimeError(f"vLLM's {owner.__name__} already has {name!r}: specserve would shadow it")
    setattr(owner, name, method)
