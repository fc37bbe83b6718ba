"""The EAGLE-3 draft head as a plain torch module, laid out like the checkpoints vLLM's ``Eagle3LlamaForCausalLM``
loads (vllm 0.32.0, ``vllm/model_executor/models/llama_eagle3.py``), with the training-time test unroll of
Li et al., "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via Training-Time Test" (2025), §3.

What vLLM computes, and this module reproduces:

- ``fc`` maps the target's concatenated aux hidden states (3 x hidden) to one hidden vector
  (``combine_hidden_states``, llama_eagle3.py:397-418).
- The one decoder layer (``midlayer.*``, mapped to ``layers.0``, llama_eagle3.py:291) attends over
  ``concat(input_layernorm(embed(token)), hidden_norm(hidden))``, 2 x hidden wide (llama_eagle3.py:131-135); its
  residual stream starts at the un-normed ``hidden`` (``_norm_after_residual``, llama_eagle3.py:117-122).
- ``norm`` then ``lm_head`` give the draft logits; the pre-norm sum is the hidden state fed to the next draft step
  (llama_eagle3.py:283-288, consumed by ``propose`` in vllm/v1/spec_decode/llm_base_proposer.py:600-605, 754-761).
- The checkpoint has no ``embed_tokens``: vLLM then shares the target's embedding (llm_base_proposer.py:1436-1442),
  so the head trains against the target's frozen embedding.

Draft position and token alignment (``set_inputs_first_pass``, llm_base_proposer.py:860-872): at target position
``t`` the head reads aux(t) and the token at ``t + 1``, and predicts the token at ``t + 2``. Draft step ``j`` for
the same anchor ``t`` sits at position ``t + j - 1``, reads the token at ``t + j`` (the previous draft token) and the
previous step's pre-norm hidden, and attends to the first pass's keys of anchors ``<= t`` plus its own earlier
steps' keys for ``t``: exactly what vLLM's KV cache holds at that point.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (x.float() * scale).to(x.dtype) * self.weight


class Attention(nn.Module):
    """Llama attention; the EAGLE-3 layer's q/k/v read a 2 x hidden input (llama_eagle3.py:82-96), a Qwen2 layer's
    have biases (specserve.models.mtp)."""

    def __init__(self, config: LlamaConfig, input_width: int, qkv_bias: bool = False) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.rope_theta = float(config.rope_parameters["rope_theta"])
        self.q_proj = nn.Linear(input_width, self.num_heads * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(input_width, self.num_kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(input_width, self.num_kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Queries, keys and values of ``x`` [B, A, width] at ``positions`` [A], heads first: [B, heads, A, d]."""
        batch, length, _ = x.shape

        def heads(t: torch.Tensor, n: int) -> torch.Tensor:
            return t.view(batch, length, n, self.head_dim).transpose(1, 2)

        cos, sin = rope_tables(positions, self.head_dim, self.rope_theta, x.dtype)
        q = rotate(heads(self.q_proj(x), self.num_heads), cos, sin)
        k = rotate(heads(self.k_proj(x), self.num_kv_heads), cos, sin)
        v = heads(self.v_proj(x), self.num_kv_heads)
        group = self.num_heads // self.num_kv_heads
        return q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

    def causal(self, x: torch.Tensor) -> torch.Tensor:
        """Causal self-attention of ``x`` [B, N, width] at positions 0..N-1, through ``o_proj``."""
        q, k, v = self.project(x, torch.arange(x.size(1)))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Midlayer(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps)
        self.hidden_norm = RMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)
        self.self_attn = Attention(config, input_width=2 * config.hidden_size)
        self.mlp = MLP(config)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotary embedding, as vLLM's Llama uses (llama.py ``is_neox_style = True``)."""
    half = x.size(-1) // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Eagle3Head(nn.Module):
    """The trainable head: ``fc``, ``midlayer``, ``norm`` and ``lm_head``; ``embed`` is the target's, frozen."""

    def __init__(self, config: LlamaConfig, num_aux: int, embed: torch.Tensor) -> None:
        super().__init__()
        self.fc = nn.Linear(num_aux * config.hidden_size, config.hidden_size, bias=False)
        self.midlayer = Midlayer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.register_buffer("embed", embed.detach().clone(), persistent=False)

    def checkpoint(self) -> dict[str, torch.Tensor]:
        """The weights under the names vLLM's loader expects (no ``model.`` prefix, no embed_tokens)."""
        return {name: tensor.detach() for name, tensor in self.state_dict().items()}

    def unroll(self, aux: torch.Tensor, tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Draft logits of ``steps`` chained draft steps for every anchor position.

        ``aux`` [B, N, num_aux * h] are the target's aux hidden states at positions 0..N-1 and ``tokens`` [B, N] the
        sequence. Anchors are positions 0..A-1 with A = N - steps; step j (1-based) returns [B, A, vocab] logits
        for the token at anchor + j + 1, having read the true token at anchor + j (the previous draft token when
        every earlier one was accepted: only those drafts count under speculative decoding).
        """
        anchors = tokens.size(1) - steps
        if anchors < 1:
            raise ValueError(f"sequences of {tokens.size(1)} tokens are too short for {steps} draft steps")
        layer, attn = self.midlayer, self.midlayer.self_attn
        hidden = self.fc(aux[:, :anchors])
        base_positions = torch.arange(anchors)
        causal = torch.ones(anchors, anchors, dtype=torch.bool).tril()
        scale = 1.0 / math.sqrt(attn.head_dim)
        first_kv: tuple[torch.Tensor, torch.Tensor] | None = None
        own_kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        logits = []
        for step in range(1, steps + 1):
            residual = hidden
            embeds = F.embedding(tokens[:, step : step + anchors], self.embed)
            x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], dim=-1)
            q, k, v = attn.project(x, base_positions + step - 1)
            if first_kv is None:
                first_kv = (k, v)
            else:
                own_kv.append((k, v))
            # Keys of the first pass over anchors <= t, then this anchor's own later-step keys (one each).
            scores = [(q @ first_kv[0].transpose(-1, -2)).masked_fill(~causal, float("-inf"))]
            scores += [(q * key).sum(-1, keepdim=True) for key, _ in own_kv]
            probs = torch.softmax(torch.cat(scores, dim=-1) * scale, dim=-1)
            out = probs[..., :anchors] @ first_kv[1]
            for i, (_, value) in enumerate(own_kv):
                out = out + probs[..., anchors + i : anchors + i + 1] * value
            out = out.transpose(1, 2).reshape(*hidden.shape[:2], -1)
            residual = attn.o_proj(out) + residual
            hidden = layer.mlp(layer.post_attention_layernorm(residual)) + residual
            logits.append(self.lm_head(self.norm(hidden)))
        return logits
