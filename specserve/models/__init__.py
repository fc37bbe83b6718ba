"""Tiny local target/draft model pairs for vLLM speculative decoding on CPU.

    from specserve.models import cached_pair
    pair = cached_pair("trained")          # built once (2-8 min), then reused
    LLM(model=str(pair.target),
        speculative_config={"method": "draft_model", "model": str(pair.draft), "num_speculative_tokens": 4})

Kinds: ``trained`` (distilled draft, position-0 acceptance about 0.8), ``self`` (draft = target,
acceptance 1.0), ``random`` (unrelated random draft, acceptance about 0) and ``perf`` (a target many
times costlier per step than its draft, with a chosen agreement: ``cached_pair("perf", size="S",
agreement=0.8)``). Draft heads for the trained target: ``cached_head("eagle3")`` (an EAGLE-3 head, method
"eagle3") and ``cached_head("mtp")`` (the target with an MTP layer, method "mtp"; specserve.models.heads).
``measure_acceptance``
(in ``specserve.models.measure``) starts a real vLLM engine; it is not imported here because
importing vLLM takes seconds.
"""

from typing import Any

# Lazy: the CLI imports this package for argument types, and torch/transformers take seconds.
_EXPORTS = {
    "BUILD_VERSION": "specserve.models.build",
    "BUILDERS": "specserve.models.build",
    "PairPaths": "specserve.models.build",
    "make_pair": "specserve.models.build",
    "cache_root": "specserve.models.cache",
    "cached_pair": "specserve.models.cache",
    "cached_head": "specserve.models.cache",
    "HeadPaths": "specserve.models.heads",
}
__all__ = ["HEAD_KINDS", "KINDS", *_EXPORTS]

from specserve.models.arguments import HEAD_KINDS, KINDS  # noqa: E402


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'specserve.models' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
