"""A tiny target with its own multi-token-prediction (MTP) layer, in the layout of Xiaomi's MiMo, the one MTP family
vLLM 0.32 runs on a dense Llama-like trunk (``python -m specserve.models make --kind mtp``).

The trunk is the trained pair's target, unchanged: MiMo is Qwen2 (vllm/model_executor/models/mimo.py:57-137), whose
attention always has q/k/v biases (vllm/model_executor/models/qwen2.py:162), so the Llama weights get zero biases
and compute the same function. ``num_nextn_predict_layers`` MTP layers follow under ``model.mtp_layers.<i>.``
(vllm/model_executor/models/mimo_mtp.py:43-88, names mapped at mimo_mtp.py:168-186): ``token_layernorm`` and
``hidden_layernorm`` normalise the next token's embedding (zeroed at position 0) and the trunk's last hidden state
before its final norm (mimo.py:87), ``input_proj`` maps their concatenation [hidden, embedding] to one hidden
vector, a Qwen2 decoder layer and ``final_layernorm`` follow, and the trunk's ``lm_head`` gives the logits. vLLM turns
the config's ``MiMoForCausalLM`` into ``MiMoMTPModel`` for ``speculative_config={"method": "mtp"}``
(vllm/config/speculative.py:725-734) and shares the trunk's embedding and lm_head with it
(vllm/v1/spec_decode/llm_base_proposer.py:1466-1472, 1545-1551).

The MTP layer is trained like the EAGLE-3 head's first step (specserve.models.eagle3): forward KL to the target's
next-token distribution one token further on, on the target's greedy continuations and corpus windows (Gloeckle et
al., "Better & Faster Large Language Models via Multi-token Prediction", 2024, §2, with a frozen trunk). vLLM's MiMo
MTP predicts one token per layer and reruns layer 0, fed its own normed output, for every further draft token
(mimo_mtp.py:200 allows step 0 only; the proposer's loop passes no step index, llm_base_proposer.py:732-738;
vLLM warns that k > 1 reruns the same layer, vllm/config/speculative.py:1376-1385).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm import tqdm
from transformers import LlamaConfig

from specserve.models import training
from specserve.models.build import BUILD_INFO_FILE, SAVE_DTYPE, torch_threads
from specserve.models.eagle3 import HEAD_BUILD_THREADS, HeadRecipe, TeacherPool, pool_rows, target_pools
from specserve.models.eagle3_head import MLP, Attention, RMSNorm
from specserve.models.heads import HeadPaths, head_paths

NUM_MTP_LAYERS = 1
# One draft step per sequence (not three, as the EAGLE-3 head): fewer steps reach the same loss.
RECIPE = HeadRecipe(steps=300)
# What the model folder needs besides config and weights (tokenizer, chat template, generation config).
COPIED_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


class MTPLayer(nn.Module):
    """One MiMo MTP layer (mimo_mtp.py:43-88); its state-dict names are the checkpoint's under model.mtp_layers.<i>."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.token_layernorm = RMSNorm(h, eps)
        self.hidden_layernorm = RMSNorm(h, eps)
        self.input_proj = nn.Linear(2 * h, h, bias=False)
        self.input_layernorm = RMSNorm(h, eps)
        self.self_attn = Attention(config, input_width=h, qkv_bias=True)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.mlp = MLP(config)
        self.final_layernorm = RMSNorm(h, eps)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """For [B, N, h] embeddings of the tokens at positions 1..N and the trunk's states at 0..N-1: the normed
        states whose logits predict the tokens at 2..N+1."""
        embeds = embeds.clone()
        embeds[:, 0] = 0  # vLLM masks the embedding at position 0 (mimo_mtp.py:76)
        x = self.input_proj(torch.cat([self.hidden_layernorm(hidden), self.token_layernorm(embeds)], dim=-1))
        residual = self.self_attn.causal(self.input_layernorm(x)) + x
        return self.final_layernorm(self.mlp(self.post_attention_layernorm(residual)) + residual)


def new_mtp_layer(config: LlamaConfig, seed: int) -> MTPLayer:
    torch.manual_seed(seed)
    layer = MTPLayer(config)
    for module in layer.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=config.initializer_range)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    return layer


class MTPTrainee(nn.Module):
    """The MTP layer with the trunk's frozen embedding and lm_head, as vLLM shares them."""

    def __init__(self, layer: MTPLayer, embed: torch.Tensor, lm_head: torch.Tensor) -> None:
        super().__init__()
        self.layer = layer
        self.register_buffer("embed", embed.detach().clone(), persistent=False)
        self.register_buffer("lm_head", lm_head.detach().clone(), persistent=False)

    def logits(self, tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """[B, N - 1, vocab]: at anchor t, the draft for the token at t + 2."""
        return self.layer(F.embedding(tokens[:, 1:], self.embed), hidden[:, :-1]) @ self.lm_head.T


def mtp_loss(pool: TeacherPool) -> training.LossFn:
    def loss(model: MTPTrainee, rows: torch.Tensor) -> torch.Tensor:
        logits = model.logits(pool.tokens[rows], pool.aux[rows].float())
        wanted = pool.log_probs[rows][:, 1:].float()
        vocab = logits.size(-1)
        student = F.log_softmax(logits.float(), dim=-1).reshape(-1, vocab)
        return F.kl_div(student, wanted.reshape(-1, vocab), log_target=True, reduction="batchmean")

    return loss


@torch.no_grad()
def mtp_agreement(model: MTPTrainee, pool: TeacherPool, start: int) -> float:
    """Share of anchors from ``start`` on where the MTP layer's argmax is the target's next-but-one token."""
    drafted = model.logits(pool.tokens, pool.aux.float()).argmax(-1)[:, start:]
    return (drafted == pool.log_probs.argmax(-1)[:, start + 1 :]).float().mean().item()


def mimo_config(target_config: dict) -> dict:
    """The trained target's Llama config naming MiMo as its architecture, with MTP layers.

    ``model_type`` stays "llama": vLLM keys MiMo on the architecture alone (vllm/config/speculative.py:725,
    vllm/model_executor/models/registry.py:176), and every field its Qwen2 layers read is a Llama one too. As "qwen2"
    the folder would also make transformers 5 load its tokenizer as Qwen2Tokenizer, which splits text its own way
    (transformers/models/auto/tokenization_auto.py:418, 843-866): vLLM then tokenized the prompts differently.
    """
    return target_config | {"architectures": ["MiMoForCausalLM"], "num_nextn_predict_layers": NUM_MTP_LAYERS}


def with_qkv_biases(weights: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """Zero q/k/v biases for every attention under ``prefix`` that has none (Qwen2 loads them)."""
    out = dict(weights)
    for name, tensor in weights.items():
        if name.startswith(prefix) and name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
            bias = name.removesuffix("weight") + "bias"
            out.setdefault(bias, torch.zeros(tensor.size(0), dtype=tensor.dtype))
    return out


def save_mimo(target_dir: Path, layers: list[MTPLayer], model_dir: Path) -> None:
    """The target's folder as a MiMo model whose ``model.mtp_layers.<i>`` are ``layers``."""
    model_dir.mkdir(parents=True, exist_ok=True)
    weights = with_qkv_biases(load_file(target_dir / "model.safetensors"), "model.layers.")
    for index, layer in enumerate(layers):
        weights.update({f"model.mtp_layers.{index}.{n}": t.detach() for n, t in layer.state_dict().items()})
    weights = {name: tensor.to(SAVE_DTYPE).contiguous() for name, tensor in weights.items()}
    save_file(weights, model_dir / "model.safetensors", metadata={"format": "pt"})
    target_config = json.loads((target_dir / "config.json").read_text(encoding="utf-8"))
    config = mimo_config(target_config) | {"num_nextn_predict_layers": len(layers)}
    (model_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    for name in COPIED_FILES:
        if (target_dir / name).is_file():
            shutil.copyfile(target_dir / name, model_dir / name)


def make_mtp_target(
    out_dir: Path, target_dir: Path, *, seed: int = 0, progress: bool = True, recipe: HeadRecipe = RECIPE
) -> HeadPaths:
    """Write ``out_dir/head``: the target in ``target_dir`` as a MiMo model with a trained MTP layer (1-3 min)."""
    started, out_dir, target_dir = time.monotonic(), Path(out_dir), Path(target_dir)
    with (
        torch_threads(HEAD_BUILD_THREADS),
        tqdm(total=recipe.steps, desc="rollouts", file=sys.stderr, disable=not progress) as bar,
    ):
        # The MTP layer reads the trunk's last layer output before the final norm: aux id num_layers.
        num_layers = json.loads((target_dir / "config.json").read_text(encoding="utf-8"))["num_hidden_layers"]
        target, pool, eval_pool = target_pools(target_dir, recipe, seed, (num_layers,))
        bar.set_description("mtp")
        layer = new_mtp_layer(target.config, seed)
        model = MTPTrainee(layer, target.model.embed_tokens.weight.float(), target.lm_head.weight.float())
        loss = training.train(
            model,
            pool_rows(pool, recipe.batch_size, torch.Generator().manual_seed(seed + 1)),
            mtp_loss(pool),
            steps=recipe.steps,
            lr=recipe.lr,
            warmup_steps=recipe.warmup_steps,
            bar=bar,
        )
        agreement = mtp_agreement(model, eval_pool, recipe.rollout_prefix_len - 1)
    paths = head_paths("mtp", out_dir, target_dir)
    save_mimo(target_dir, [layer], paths.head)
    info = dict(
        kind="mtp",
        seed=seed,
        target=str(target_dir),
        num_mtp_layers=1,
        build_s=round(time.monotonic() - started, 1),
        loss=round(loss, 4),
        step_agreement=[round(agreement, 4)],
    )
    (out_dir / BUILD_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return paths
