"""The bundled draft heads on vLLM's own speculation (plain ``vllm.LLM``, no specserve scheduler): the EAGLE-3 head
(method eagle3) and the MiMo-layout target with its MTP layer (method mtp). Greedy output is the trained target's
plain output, and a trained head is accepted far more often than an untrained one of the same shape."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from specserve.models import eagle3, mtp
from specserve.models.cache import cached_head
from specserve.models.heads import HEAD_DIR
from specserve.models.prompts import OPENINGS
from specserve.replicas.tools.offline import MEASURE_ENGINE_KWARGS, offline_llm, spec_decode_counters

K = 3
MAX_TOKENS = 48


def decode(target: str, head: str | None, method: str = "eagle3", k: int = K) -> tuple[list[list[int]], dict]:
    """Greedy outputs for the openings, and vLLM's spec-decode counters over the run (empty without a head)."""
    from vllm import SamplingParams

    speculative = {"method": method, "model": head, "num_speculative_tokens": k} if head else None
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
    head_dir = out_dir / HEAD_DIR
    eagle3.save_head(eagle3.new_head(target, seed=0), target_dir, tokenizer, head_dir)
    return str(head_dir)


@pytest.fixture(scope="module")
def plain(trained_pair) -> list[list[int]]:
    return decode(str(trained_pair.target), None)[0]


# `make test-slow`'s, as the MTP one below (CI time): the serve tier serves the bundled EAGLE-3 head and MTP target
# losslessly with drafts accepted (tests/serve/test_methods_served.py); these add the untrained heads' zero beside.
@pytest.mark.slow
def test_eagle3_head_is_lossless_and_accepted(trained_pair, plain, tmp_path, record_property):
    target, head = str(trained_pair.target), str(cached_head("eagle3"))
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


def untrained_mtp_target(target_dir, out_dir) -> str:
    """The MTP build's starting point: the same trunk with a seeded MTP layer never trained (so the same plain
    output)."""
    config = LlamaForCausalLM.from_pretrained(target_dir).config
    mtp.save_mimo(target_dir, [mtp.new_mtp_layer(config, seed=0)], out_dir)
    return str(out_dir)


@pytest.fixture(scope="module")
def mtp_plain() -> list[list[int]]:
    # The MiMo folder's own plain output, not the Llama target's: the same weights, but vLLM's MiMo adds the last
    # residual in bf16 before the final norm (mimo.py:87) where Llama's fused add-norm adds and normalises in fp32
    # (vllm/ir/ops/layernorm.py:44-58), and on one opening of eight a near tie went the other way after 29 tokens.
    return decode(str(cached_head("mtp")), None)[0]


# `make test-slow`'s at both k (CI time): the serve tier runs MTP under every policy.
@pytest.mark.slow
@pytest.mark.parametrize("k", [1, K])
def test_mtp_target_is_lossless_and_accepted(trained_pair, mtp_plain, tmp_path, record_property, k):
    model = str(cached_head("mtp"))
    trained_tokens, trained = decode(model, model, method="mtp", k=k)
    untrained_model = untrained_mtp_target(trained_pair.target, tmp_path / "untrained")
    untrained_tokens, untrained = decode(untrained_model, untrained_model, method="mtp", k=k)
    record_property("trained", trained)
    record_property("untrained", untrained)
    print(f"\nk={k} trained MTP layer: {trained}\nuntrained MTP layer: {untrained}")

    assert trained_tokens == mtp_plain
    assert untrained_tokens == mtp_plain
    assert trained["acceptance_per_pos"][0] > 2 * untrained["acceptance_per_pos"][0]
    assert trained["mean_accepted_length"] > untrained["mean_accepted_length"] + 0.25 * k
