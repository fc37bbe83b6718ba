"""Tiny local target/draft model pairs for vLLM speculative decoding on CPU.

    from specserve.models import cached_pair
    pair = cached_pair("trained")          # built once (about 2 min), then reused
    LLM(model=str(pair.target),
        speculative_config={"method": "draft_model", "model": str(pair.draft), "num_speculative_tokens": 4})

Kinds: ``trained`` (distilled draft, position-0 acceptance about 0.8), ``self`` (draft = target,
acceptance 1.0) and ``random`` (unrelated random draft, acceptance about 0). ``measure_acceptance``
(in ``specserve.models.acceptance``) starts a real vLLM engine; it is not imported here because
importing vLLM takes seconds.
"""

from specserve.models.build import BUILD_VERSION, BUILDERS, PairPaths, make_pair
from specserve.models.cache import cache_root, cached_pair

KINDS = tuple(BUILDERS)

__all__ = ["BUILD_VERSION", "KINDS", "PairPaths", "cache_root", "cached_pair", "make_pair"]
