"""The MiMo-layout MTP target's pure parts on a toy trunk: the converted trunk computes what the Llama did, the MTP
layer's checkpoint names are the ones vLLM's MiMo MTP loader maps, and the layer reads what vLLM feeds it."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from specserve.models import mtp
from specserve.models.build import torch_threads
from specserve.models.tokenizer import save_tokenizer, train_tokenizer

TOY = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)
# Every name vLLM's MiMoMTP.load_weights maps for one layer (vllm/model_executor/models/mimo_mtp.py:54-65, 168-186).
MTP_NAMES = {
    *(f"{norm}.weight" for norm in ("token_layernorm", "hidden_layernorm", "final_layernorm")),
    *(f"{norm}.weight" for norm in ("input_layernorm", "post_attention_layernorm")),
    "input_proj.weight",
    *(f"self_attn.{p}_proj.{kind}" for p in "qkv" for kind in ("weight", "bias")),
    "self_attn.o_proj.weight",
    *(f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def toy_target(tmp_path_factory):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TOY)).eval()
    path = tmp_path_factory.mktemp("toy") / "target"
    model.to(torch.bfloat16).save_pretrained(path)
    save_tokenizer(train_tokenizer(["def f(x):\n    return x\n"] * 4), path)
    return path


def test_mimo_folder_is_the_same_trunk_with_mtp_layers(toy_target, tmp_path):
    config = LlamaForCausalLM.from_pretrained(toy_target).config
    mtp.save_mimo(toy_target, [mtp.new_mtp_layer(config, seed=0)], tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == ["MiMoForCausalLM"]
    assert saved["num_nextn_predict_layers"] == 1

    weights = load_file(tmp_path / "model.safetensors")
    layer_names = {n.removeprefix("model.mtp_layers.0.") for n in weights if n.startswith("model.mtp_layers.0.")}
    assert layer_names == MTP_NAMES
    assert not [n for n in weights if n.startswith("model.mtp_layers.1.")]
    assert torch.count_nonzero(weights["model.layers.0.self_attn.q_proj.bias"]) == 0

    # vLLM loads the tokenizer with transformers' AutoTokenizer, which picks its class by model type.
    text = "def f(x):\n    return x\n"
    assert (
        AutoTokenizer.from_pretrained(tmp_path)(text).input_ids
        == AutoTokenizer.from_pretrained(toy_target)(text).input_ids
    )

    tokens = torch.randint(0, TOY["vocab_size"], (2, 9))
    llama = LlamaForCausalLM.from_pretrained(toy_target, dtype=torch.float32).eval()
    qwen2 = Qwen2ForCausalLM(Qwen2Config(**saved)).eval()
    qwen2.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=False)
    with torch.no_grad():
        torch.testing.assert_close(qwen2(input_ids=tokens).logits, llama(input_ids=tokens).logits)


@torch.no_grad()
def test_mtp_layer_is_causal_and_ignores_the_first_embedding():
    config = LlamaConfig(**TOY)
    layer = mtp.new_mtp_layer(config, seed=0).eval()
    embeds, hidden = torch.randn(1, 6, TOY["hidden_size"]), torch.randn(1, 6, TOY["hidden_size"])
    out = layer(embeds, hidden)
    later = embeds.clone()
    later[:, 4:] += 1.0
    torch.testing.assert_close(layer(later, hidden)[:, :4], out[:, :4])
    assert not torch.allclose(layer(later, hidden)[:, 4:], out[:, 4:])
    first = embeds.clone()
    first[:, 0] += 1.0
    torch.testing.assert_close(layer(first, hidden), out)


def test_mtp_loss_falls_on_a_pool():
    from specserve.models.eagle3 import teacher_pool

    torch.manual_seed(0)
    target = LlamaForCausalLM(LlamaConfig(**TOY)).eval()
    pool = teacher_pool(target, torch.randint(0, TOY["vocab_size"], (8, 16)), (TOY["num_hidden_layers"],))
    model = mtp.MTPTrainee(
        mtp.new_mtp_layer(target.config, seed=0), target.model.embed_tokens.weight, target.lm_head.weight
    )
    loss, rows = mtp.mtp_loss(pool), torch.arange(8)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        value = loss(model, rows)
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
        losses.append(value.item())
    assert losses[-1] < 0.5 * losses[0]
