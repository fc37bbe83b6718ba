"""The EAGLE-3 head's pure parts on a toy target: which target tensors are the aux states, the training-time-test
unroll against a step-by-step decode with an explicit KV cache (what vLLM's proposer does), the checkpoint's
names and config, and the command line."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specserve.models import eagle3
from specserve.models.__main__ import build_parser
from specserve.models.build import torch_threads
from specserve.models.eagle3_head import Eagle3Head
from specserve.models.tokenizer import read_corpus, save_tokenizer, train_tokenizer

TOY = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Toy tensors: a second thread only adds OpenMP contention on a shared 2-core machine (seconds per op).
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def target() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**TOY)).eval()


@pytest.fixture(scope="module")
def head(target) -> Eagle3Head:
    head = eagle3.new_head(target, seed=1)
    # Untrained norms are all ones; perturb every weight so that a swapped or skipped one shows.
    with torch.no_grad():
        for param in head.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    return head.eval()


def test_aux_states_are_the_residual_stream_entering_each_layer(target):
    tokens = torch.randint(0, TOY["vocab_size"], (2, 7))
    with torch.no_grad():
        aux = eagle3.aux_hidden_states(target, tokens, (4, 0, 2))
        hidden = target(input_ids=tokens, output_hidden_states=True).hidden_states
    h = TOY["hidden_size"]
    parts = aux.split(h, dim=-1)
    assert len(parts) == 3  # increasing id order, as vLLM sorts them
    torch.testing.assert_close(parts[0], hidden[0])
    torch.testing.assert_close(parts[1], hidden[2])
    # Id 4 is the last layer's output before the final norm: transformers' last entry is the same tensor normed.
    torch.testing.assert_close(target.model.norm(parts[2]), hidden[4])
    assert not torch.allclose(parts[2], hidden[4])


def decode_step(head: Eagle3Head, token, hidden, position, cache):
    """One draft position as vLLM runs it: append its key and value to ``cache``, attend over all of it."""
    layer, attn = head.midlayer, head.midlayer.self_attn
    x = torch.cat([layer.input_layernorm(F.embedding(token, head.embed)), layer.hidden_norm(hidden)], dim=-1)
    q, k, v = attn.project(x.view(1, 1, -1), torch.tensor([position]))
    cache.append((k, v))
    keys, values = torch.cat([c[0] for c in cache], dim=2), torch.cat([c[1] for c in cache], dim=2)
    out = F.scaled_dot_product_attention(q, keys, values).transpose(1, 2).reshape(1, -1)
    residual = attn.o_proj(out) + hidden
    pre_norm = layer.mlp(layer.post_attention_layernorm(residual)) + residual
    return head.lm_head(head.norm(pre_norm))[0], pre_norm[0]


@torch.no_grad()
def test_unroll_matches_step_by_step_decoding(target, head):
    steps, length = 3, 12
    tokens = torch.randint(0, TOY["vocab_size"], (1, length))
    aux = eagle3.aux_hidden_states(target, tokens, eagle3.AUX_LAYER_IDS)
    unrolled = head.unroll(aux, tokens, steps)
    assert [tuple(s.shape) for s in unrolled] == [(1, length - steps, TOY["vocab_size"])] * steps
    for anchor in (0, 4, length - steps - 1):
        # First pass over positions 0..anchor: token p + 1 with the target's aux state at p.
        cache: list = []
        for p in range(anchor + 1):
            logits, hidden = decode_step(head, tokens[0, p + 1], head.fc(aux[0, p]), p, cache)
        torch.testing.assert_close(unrolled[0][0, anchor], logits)
        # Later steps: the next token (the previous draft, when it was right) with the previous step's hidden.
        for step in range(2, steps + 1):
            logits, hidden = decode_step(head, tokens[0, anchor + step], hidden, anchor + step - 1, cache)
            torch.testing.assert_close(unrolled[step - 1][0, anchor], logits)


@torch.no_grad()
def test_checkpoint_and_config_are_what_vllm_loads(target, head, tmp_path):
    tokenizer: PreTrainedTokenizerFast = train_tokenizer(["def f(x):\n    return x\n"] * 4)
    target_dir, head_dir = tmp_path / "target", tmp_path / "head"
    target.save_pretrained(target_dir)
    eagle3.save_head(head, target_dir, tokenizer, head_dir)

    weights = load_file(head_dir / "model.safetensors")
    h, q = TOY["hidden_size"], TOY["num_attention_heads"] * TOY["head_dim"]
    assert weights["fc.weight"].shape == (h, len(eagle3.AUX_LAYER_IDS) * h)
    assert weights["midlayer.self_attn.q_proj.weight"].shape == (q, 2 * h)
    assert weights["lm_head.weight"].shape == (TOY["vocab_size"], h)
    assert {"midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight", "norm.weight"} <= set(weights)
    # No embedding (vLLM shares the target's), no "model." prefix (vLLM's loader adds it).
    assert not [name for name in weights if "embed" in name or name.startswith("model.")]
    assert all(t.dtype == torch.bfloat16 for t in weights.values())

    config = json.loads((head_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["num_hidden_layers"] == 1
    assert config["draft_vocab_size"] == config["vocab_size"] == TOY["vocab_size"]
    assert config["target_hidden_size"] == h
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(eagle3.AUX_LAYER_IDS)
    assert max(eagle3.AUX_LAYER_IDS) <= TOY["num_hidden_layers"]


def test_head_loss_falls_when_trained_on_a_pool(target):
    gen = torch.Generator().manual_seed(0)
    pool = eagle3.teacher_pool(target, torch.randint(0, TOY["vocab_size"], (8, 16), generator=gen))
    head = eagle3.new_head(target, seed=0)
    loss = eagle3.head_loss(pool, steps=2, weight_decay=0.8)
    rows = torch.arange(8)
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        value = loss(head, rows)
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
        losses.append(value.item())
    assert losses[-1] < 0.5 * losses[0]


def test_command_line_takes_head_kinds():
    parser = build_parser()
    args = parser.parse_args(["make", "--kind", "eagle3", "--out", "x"])
    assert args.kind == "eagle3"
    assert parser.parse_args(["cached", "--kind", "eagle3"]).kind == "eagle3"
    with pytest.raises(SystemExit):
        parser.parse_args(["make", "--kind", "medusa", "--out", "x"])


def test_cached_head_refuses_an_unknown_kind_before_building(tmp_path):
    from specserve.models.cache import cached_head

    with pytest.raises(ValueError, match="medusa"):
        cached_head("medusa", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_head_build_is_deterministic(tmp_path):
    tokenizer = train_tokenizer(read_corpus())
    torch.manual_seed(0)
    toy = LlamaForCausalLM(LlamaConfig(**{**TOY, "vocab_size": len(tokenizer)})).eval()
    target_dir = tmp_path / "target"
    toy.save_pretrained(target_dir)
    save_tokenizer(tokenizer, target_dir)
    recipe = eagle3.HeadRecipe(seq_len=24, batch_size=4, steps=3, warmup_steps=1, num_rollouts=4, rollout_prefix_len=8)
    built = [eagle3.make_eagle3_head(tmp_path / name, target_dir, progress=False, recipe=recipe).head for name in "ab"]
    first, second = (load_file(head / "model.safetensors") for head in built)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)
    assert (built[0] / "config.json").read_text() == (built[1] / "config.json").read_text()
