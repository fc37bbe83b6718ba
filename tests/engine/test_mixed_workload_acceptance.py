"""The mixed workload does what it is for on the tiny trained target: under vLLM's prompt-lookup (n-gram)
speculation the copy requests' drafts are accepted more often than the free-form ones'.

One plain offline vLLM engine (bf16, eager, greedy), the workload's first requests sent one class at a time,
vLLM's own spec-decode counters read around each class."""

from __future__ import annotations

from specserve.bench.mixed_acceptance import NGRAM, class_prompts, measure
from specserve.bench.workload import COPY, FREE


def test_ngram_speculation_accepts_more_on_copy_requests_than_on_free_form_ones(trained_pair):
    prompts = class_prompts(seed=0, requests=20)
    assert prompts[COPY] and prompts[FREE]
    measured = measure(str(trained_pair.target), NGRAM, prompts, max_tokens=40)
    copy, free = measured[COPY], measured[FREE]
    # Both classes drafted: the comparison is between two measured rates, not against an empty class.
    assert copy["draft_tokens"] > 0 and free["draft_tokens"] > 0
    assert copy["acceptance"] > free["acceptance"], measured
    # The copy answers re-state their prompts' blocks: the reason their drafts are accepted.
    blocks_repeated = sum(text in prompt for text, prompt in zip(copy["texts"], prompts[COPY], strict=True))
    assert blocks_repeated > sum(text in prompt for text, prompt in zip(free["texts"], prompts[FREE], strict=True))
