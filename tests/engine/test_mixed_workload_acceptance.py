"""The mixed workload does what it is for on the tiny trained target: under vLLM's prompt-lookup (n-gram)
speculation the copy requests' drafts are accepted more often than the free-form ones'.

One plain offline vLLM engine (bf16, eager, greedy), the workload's first requests sent one class at a time,
vLLM's own spec-decode counters read around each class (bench/mixed_acceptance.py measures the same for the docs)."""

from __future__ import annotations

from vllm import SamplingParams

from specserve.bench.workload import COPY, FREE, MixedWorkload
from specserve.replicas.tools.offline import MEASURE_ENGINE_KWARGS, offline_llm, spec_decode_counters

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def test_ngram_speculation_accepts_more_on_copy_requests_than_on_free_form_ones(trained_pair):
    prompts: dict[str, list[str]] = {COPY: [], FREE: []}
    for request in MixedWorkload(seed=0, copy_share=0.5).requests(20):
        prompts[request.request_class].append(request.text)
    assert prompts[COPY] and prompts[FREE]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    measured = {}
    with offline_llm(model=str(trained_pair.target), speculative_config=NGRAM, **MEASURE_ENGINE_KWARGS) as llm:
        for name, texts in prompts.items():
            before = spec_decode_counters(llm)
            answers = [o.outputs[0].text for o in llm.generate(texts, params, use_tqdm=False)]
            after = spec_decode_counters(llm)
            drafted, accepted = (after[k] - before[k] for k in ("draft_tokens", "accepted"))
            # Both classes drafted: the comparison is between two measured rates, not against an empty class.
            assert drafted > 0, name
            repeated = sum(answer in prompt for answer, prompt in zip(answers, texts, strict=True))
            measured[name] = {"acceptance": accepted / drafted, "answers_found_in_prompt": repeated}
    assert measured[COPY]["acceptance"] > measured[FREE]["acceptance"], measured
    # The copy answers re-state their prompts' blocks: the reason their drafts are accepted.
    assert measured[COPY]["answers_found_in_prompt"] > measured[FREE]["answers_found_in_prompt"], measured
