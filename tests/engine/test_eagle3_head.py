"""The bundled EAGLE-3 head on vLLM's own eagle3 speculation (plain ``vllm.LLM``, no specserve scheduler): greedy
output is the target's, and the trained head's acceptance is far above an untrained head's of the same shape."""

from __future__ import annotations

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from specserve.models import eagle3
from specserve.models.cache import cached_head
from specserve.models.prompts import OPENINGS
from specserve.replicas.tools.offline import MEASURE_ENGINE_KWARGS, offline_llm, spec_decode_counters

K = 3
MAX_TOKENS = 48


def decode(target: str, head: str | None) -> tuple[list[list[int]], dict]:
    """Greedy outputs for the openings, and vLLM's spec-decode counters over the run (empty without a head)."""
    from vllm import SamplingParams

    speculative = {"method": "eagle3", "model": head, "num_speculative_tokens": K} if head else None
    with offline_llm(model=target, speculative_config=speculative, **MEASURE_ENGINE_KWARGS) as llm:
        before = spec_decode_counters(llm)
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        outputs = llm.generate(list(OPENINGS), params, use_tqdm=False)
        after = spec_decode_counters(llm)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    if head is None:
        return tokens, {}
    drafts = after["drafts"] - before["drafts"]
    per_pos = [(a - b) / drafts for a, b in zip(after["per_pos"], before["per_pos"], strict=True)]
    accepted = after["accepted"] - before["accepted"]
    return tokens, {"drafts": drafts, "acceptance_per_pos": per_pos, "mean_accepted_length": 1 + accepted / drafts}


def untrained_head(target_dir, out_dir) -> str:
    """The build's own starting point: a seeded head never trained (its lm_head is the target's)."""
    target = LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(target_dir)
    head_dir = out_dir / eagle3.HEAD_DIR
    eagle3.save_head(eagle3.new_head(target, seed=0), target_dir, tokenizer, head_dir)
    return str(head_dir)


def test_eagle3_head_is_lossless_and_accepted(trained_pair, tmp_path, record_property):
    target, head = str(trained_pair.target), str(cached_head("eagle3"))
    plain, _ = decode(target, None)
    trained_tokens, trained = decode(target, head)
    untrained_tokens, untrained = decode(target, untrained_head(trained_pair.target, tmp_path))
    record_property("trained", trained)
    record_property("untrained", untrained)
    print(f"\ntrained head: {trained}\nuntrained head: {untrained}")

    assert trained_tokens == plain
    assert untrained_tokens == plain
    assert trained["drafts"] > 0 and untrained["drafts"] > 0
    # Every position of the trained head is accepted more often than the untrained head's first.
    assert min(trained["acceptance_per_pos"]) > 2 * untrained["acceptance_per_pos"][0]
    assert trained["mean_accepted_length"] > untrained["mean_accepted_length"] + 1.0
