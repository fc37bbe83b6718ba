"""Short CPU training runs for the trained pair: a language-model target and a distilled draft.

The recipe is what makes a 0.5 M-parameter draft agree with a 2.9 M-parameter target often enough to
be useful: the target learns stdlib Python by next-token prediction, then the draft is trained to
match the target's full next-token distribution (forward KL, Hinton et al. 2015, "Distilling the
Knowledge in a Neural Network") on two kinds of text — corpus windows, and the target's own greedy
continuations of corpus prefixes. The second kind is exactly what the draft sees under greedy
speculative decoding, where every context it extends was written by the target.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeAlias

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast


@dataclass(frozen=True, slots=True)
class TrainRecipe:
    """Hyper-parameters of one trained-pair build. Changing any default means bumping BUILD_VERSION."""

    # Training windows: tokens per sequence and sequences per optimizer step.
    seq_len: int = 128
    batch_size: int = 16
    target_steps: int = 700
    target_lr: float = 3e-3
    draft_steps: int = 500
    draft_lr: float = 3e-3
    # Linear warm-up, then cosine decay to 10 % of the peak learning rate.
    warmup_steps: int = 20
    # Target greedy rollouts for distillation: this many sequences, each a corpus prefix of
    # rollout_prefix_len tokens continued greedily to seq_len tokens.
    num_rollouts: int = 256
    rollout_prefix_len: int = 16
    # Share of each draft batch taken from the rollouts; the rest are corpus windows.
    rollout_fraction: float = 0.5


Batch: TypeAlias = torch.Tensor  # [batch_size, seq_len] token ids
LossFn = Callable[[LlamaForCausalLM, Batch], torch.Tensor]


def token_stream(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    """The corpus as one flat stream of token ids, each text followed by </s>."""
    encodings = tokenizer.backend_tokenizer.encode_batch(texts)
    eos = tokenizer.eos_token_id
    return torch.tensor([i for e in encodings for i in [*e.ids, eos]], dtype=torch.long)


def corpus_windows(data: torch.Tensor, batch_size: int, seq_len: int, gen: torch.Generator) -> Batch:
    """Random contiguous windows of the flat token stream ``data``."""
    starts = torch.randint(0, data.numel() - seq_len, (batch_size,), generator=gen)
    return torch.stack([data[s : s + seq_len] for s in starts.tolist()])


def forever(make: Callable[[], Batch]) -> Iterator[Batch]:
    while True:
        yield make()


def mixed_batches(
    rollouts: Batch,
    windows: Callable[[int], Batch],
    batch_size: int,
    rollout_fraction: float,
    gen: torch.Generator,
) -> Iterator[Batch]:
    """Endless batches of ``rollout_fraction`` random rollout rows plus fresh corpus windows."""
    num_rollout_rows = round(batch_size * rollout_fraction)
    while True:
        picked = torch.randint(0, rollouts.size(0), (num_rollout_rows,), generator=gen)
        yield torch.cat([rollouts[picked], windows(batch_size - num_rollout_rows)])


def lm_loss(model: LlamaForCausalLM, batch: Batch) -> torch.Tensor:
    """Next-token cross-entropy."""
    logits = model(input_ids=batch).logits[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))


def distill_loss(target: LlamaForCausalLM) -> LossFn:
    """Forward KL(target || draft) over every position of the batch, averaged per token."""

    def loss(draft: LlamaForCausalLM, batch: Batch) -> torch.Tensor:
        with torch.no_grad():
            teacher = F.log_softmax(target(input_ids=batch).logits.float(), dim=-1)
        student = F.log_softmax(draft(input_ids=batch).logits.float(), dim=-1)
        vocab = student.size(-1)
        return F.kl_div(student.reshape(-1, vocab), teacher.reshape(-1, vocab), log_target=True, reduction="batchmean")

    return loss


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX-512-BF16 or AMX). There bf16 autocast halves a training step;
    elsewhere PyTorch emulates it, and a step took 12 x as long as in fp32 (an AVX2-only EPYC), so the pair trains
    in fp32 (weights and optimizer state are fp32 either way)."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def train(
    model: LlamaForCausalLM,
    batches: Iterator[Batch],
    loss_fn: LossFn,
    *,
    steps: int,
    lr: float,
    warmup_steps: int,
    bar: tqdm,
) -> float:
    """AdamW with warm-up and cosine decay; returns the mean loss of the last 20 steps."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)

    def lr_factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, steps - warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    recent: list[float] = []
    autocast = native_bf16()
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(model, next(batches))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        recent = (recent + [loss.item()])[-20:]
        bar.set_postfix(loss=f"{recent[-1]:.3f}", refresh=False)
        bar.update(1)
    model.eval()
    return sum(recent) / len(recent)


@torch.no_grad()
def greedy_rollouts(model: LlamaForCausalLM, prefixes: Batch, total_len: int, chunk: int = 64) -> Batch:
    """Continue each prefix greedily to ``total_len`` tokens (HF generate with a KV cache)."""
    model.eval()
    out = []
    for part in prefixes.split(chunk):
        out.append(
            model.generate(
                input_ids=part,
                attention_mask=torch.ones_like(part),
                max_new_tokens=total_len - part.size(1),
                min_new_tokens=total_len - part.size(1),
                do_sample=False,
                pad_token_id=model.config.pad_token_id,
            )
        )
    return torch.cat(out)


@torch.no_grad()
def greedy_agreement(target: LlamaForCausalLM, draft: LlamaForCausalLM, prefixes: Batch, total_len: int) -> float:
    """Share of positions on the target's greedy path where the draft's argmax equals the target's.

    This is an estimate of the position-0 acceptance rate under greedy speculative decoding.
    """
    paths = greedy_rollouts(target, prefixes, total_len)
    start = prefixes.size(1) - 1
    # The target's greedy choices are the path itself; the draft proposes from the same contexts.
    draft_next = draft(input_ids=paths).logits[:, start:-1].argmax(-1)
    return (paths[:, start + 1 :] == draft_next).float().mean().item()
