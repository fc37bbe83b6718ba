"""The speculative methods specserve controls, and what each one's k = 0 and cost mean to a policy.

A method is a proposer: where its drafts come from, what a step it sits out leaves behind, and what it can give the
policies besides its drafts. The engine (``replicas/core/scheduler.py``, ``replicas/k0_skip.py``), the config
(``specserve.llm.Speculation``) and the simulator read the same table, so a method's k = 0 is the same everywhere.

What k = 0 means, per method:

- ``draft_model``: skip the draft's forward pass; the draft's KV then lags the target's, and the next pass catches
  it up by prepending the tokens it missed (the draft reads token ids alone).
- ``ngram`` (prompt lookup): skip the lookup; it keeps no state between steps (it searches the request's tokens
  afresh every step), so there is nothing to catch up.
- ``eagle`` / ``eagle3`` / ``mtp``: run the head's one synchronous pass over the step's new tokens, as vLLM does at
  k = 0, and price it. A head reads the target's hidden states of every position; a step it sits out leaves its KV
  without those positions, and neither the hidden states nor the target pass that made them come back later (vLLM
  PR 53426, a k = 0 skip, leaves EAGLE out as unsafe for the same reason). Keeping them for a catch-up would cost
  3 x hidden size per token per request (EAGLE-3's three aux layers); the head's pass it saves is one decoder layer,
  measured on the tiny pair in docs/user-guide/speculation-methods.md.
- ``suffix``: the proposer's suffix tree learns each response from the tokens it is handed every step, so a skipped
  step would leave the tree without them; vLLM 0.32's suffix proposer also drafts only at the configured k
  (``suffix_decoding.py`` asserts it). Refused while both hold (``refusal``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class K0(Enum):
    """What an engine does with a method's proposer on a k = 0 decode step."""

    SKIP_AND_CATCH_UP = "skip, catch up on resume"
    SKIP = "skip, nothing to catch up"
    RUN = "run the proposer's sync pass"


class Source(Enum):
    """Where the proposer's weights come from: ``speculation.draft`` names a draft model or a head; the target's
    own MTP layers; or no weights at all (lookup)."""

    DRAFT_MODEL = "a separate draft model"
    HEAD = "a head trained on the target's hidden states"
    TARGET = "the target's own MTP layers"
    NONE = "no weights (lookup in the request's tokens)"


@dataclass(frozen=True, slots=True)
class Method:
    """One speculative method, as specserve controls it."""

    name: str
    source: Source
    k0: K0
    # The proposer samples its drafts from logits, so the draft's confidence and entropy can be read per token.
    has_draft_logits: bool
    # Every proposal is exactly k wide (a model drafts k tokens); a lookup may find fewer, never more.
    exact_width: bool
    # Elastic draft memory can drop its weights and lend their bytes to the KV cache (a separate draft model only:
    # its weights and KV are apart from the target's, ``replicas/draft_memory``).
    offloadable: bool
    # The proposer's weights can be rebuilt from their source on a running engine (a collapse's restore).
    restorable: bool

    @property
    def needs_draft(self) -> bool:
        """``speculation.draft`` must name the draft model or the head."""
        return self.source in (Source.DRAFT_MODEL, Source.HEAD)

    def skips_at_k0(self) -> bool:
        return self.k0 is not K0.RUN

    def catches_up(self) -> bool:
        return self.k0 is K0.SKIP_AND_CATCH_UP


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("draft_model", Source.DRAFT_MODEL, K0.SKIP_AND_CATCH_UP, True, True, True, True),
        Method("eagle", Source.HEAD, K0.RUN, True, True, False, False),
        Method("eagle3", Source.HEAD, K0.RUN, True, True, False, False),
        Method("mtp", Source.TARGET, K0.RUN, True, True, False, False),
        Method("ngram", Source.NONE, K0.SKIP, False, False, False, False),
        Method("suffix", Source.NONE, K0.RUN, False, False, False, False),
    )
}

DEFAULT_METHOD = "draft_model"

# n-gram lookup's own knobs (vLLM's ``prompt_lookup_min/max``): the longest and shortest suffix of the request's
# tokens searched for an earlier occurrence. vLLM's defaults when unset are the same.
NGRAM_LOOKUP_MAX = 4
NGRAM_LOOKUP_MIN = 2


def method(name: str) -> Method:
    """The method by its ``speculative_config.method`` name; ValueError naming the known ones."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"method {name!r}: not one of {', '.join(METHODS)}") from None


def refusal(name: str, *, has_suffix_library: bool) -> str | None:
    """Why the pinned vLLM cannot serve ``name`` under specserve's control, or None where it can."""
    if name != "suffix":
        return None
    reasons = []
    if not has_suffix_library:
        reasons.append(
            "vLLM's suffix proposer needs arctic-inference (pip install arctic-inference==0.1.1), which ships "
            "only as a source distribution"
        )
    reasons.append(
        "vLLM 0.32's suffix proposer drafts only at its configured k (vllm/v1/spec_decode/suffix_decoding.py asserts "
        "num_speculative_tokens == its own), so no policy can choose k per step"
    )
    return "; ".join(reasons)


def check_draft(m: Method, draft: str | None, *, required: bool = True) -> None:
    """ValueError where ``draft`` is given to a method that takes none, or (``required``) missing for one that needs
    it: a draft model or a head."""
    if draft is not None and not m.needs_draft:
        raise ValueError(f"draft {draft!r}: method {m.name} takes none ({m.source.value})")
    if required and draft is None and m.needs_draft:
        raise ValueError(f"draft: required for method {m.name} ({m.source.value}: a Hugging Face id or a folder)")


def offload_refusal(m: Method) -> str:
    """Why ``draft_offload`` cannot run with method ``m`` (call where ``m.offloadable`` is false)."""
    return (
        f"draft_offload: method {m.name} has no separate draft model whose weights and KV could be lent to the KV "
        f"cache ({m.source.value}); set draft_offload: false"
    )
