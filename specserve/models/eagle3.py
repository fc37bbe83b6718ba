"""Build an EAGLE-3 head for the trained pair's target (``python -m specserve.models make --kind eagle3``).

The head (specserve.models.eagle3_head) learns the target's next-token distribution from the target's own aux hidden
states, on the text it decodes under greedy speculation: the target's greedy continuations of corpus prefixes, plus
corpus windows (the prompts). Training unrolls ``TTT_STEPS`` draft steps, each fed the previous step's hidden output
(Li et al., "EAGLE-3", §3, training-time test), with a forward-KL loss to the target's distribution at every step.

Which target tensors are the aux states: for ``eagle_aux_hidden_state_layer_ids`` = ids, vLLM 0.32 records, for each
id ``i``, the residual stream entering decoder layer ``i`` (``hidden_states + residual``), where ``i = 0`` is the
embedding output and ``i = num_layers`` the last layer's output before the final norm (vllm/model_executor/models/
llama.py:428-441 calling ``_maybe_add_hidden_state`` with ``idx + 1`` after layer ``idx``;
vllm/model_executor/models/interfaces.py:1601-1610), in increasing id order (``_set_aux_hidden_state_layers``
sorts them, interfaces.py:1577-1578), concatenated on the last axis (vllm/v1/worker/gpu_model_runner.py:4952-4972).
The ids must be written in the head's config: vLLM's default (2, L // 2, L - 3) names only two distinct layers on
this 4-layer target (interfaces.py:1712-1734, gpu_model_runner.py:5241-5249).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tqdm import tqdm
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from specserve.models import training
from specserve.models.build import BUILD_INFO_FILE, SAVE_DTYPE, no_transformers_progress_bars, torch_threads
from specserve.models.eagle3_head import Eagle3Head
from specserve.models.heads import HeadPaths, head_paths
from specserve.models.tokenizer import read_corpus, save_tokenizer

# Residual-stream taps of the 4-layer target: low, middle and the last layer's output (EAGLE-3 §3 fuses low-,
# mid- and high-level features).
AUX_LAYER_IDS = (1, 2, 4)
# Draft steps unrolled in training: the k the engine tests run.
TTT_STEPS = 3
# One torch thread: while other jobs shared the 2-core dev machine, a head training step took 5-12 s with two
# threads and 0.8 s with one (OpenMP threads spinning against each other).
HEAD_BUILD_THREADS = 1
# Target greedy paths the build's agreement estimate is measured on.
NUM_EVAL_PATHS = 32


@dataclass(frozen=True, slots=True)
class HeadRecipe:
    """Hyper-parameters of one head build. Changing any default means bumping specserve.models.heads.HEAD_VERSION."""

    seq_len: int = 128
    batch_size: int = 16
    steps: int = 400
    lr: float = 3e-3
    warmup_steps: int = 20
    num_rollouts: int = 256
    rollout_prefix_len: int = 16
    rollout_fraction: float = 0.75
    # Later draft steps matter less (they count only when the earlier ones were accepted).
    step_weight_decay: float = 0.8


def aux_hidden_states(target: LlamaForCausalLM, tokens: torch.Tensor, layer_ids: tuple[int, ...]) -> torch.Tensor:
    """What vLLM hands the head for ``tokens``: the residual stream entering each layer in ``layer_ids``
    (id = number of decoder layers already applied), concatenated in increasing id order."""
    captured: dict[int, torch.Tensor] = {}
    hooks = [target.model.embed_tokens.register_forward_hook(lambda _m, _i, out: captured.__setitem__(0, out))]
    for index, layer in enumerate(target.model.layers):
        hooks.append(
            layer.register_forward_hook(
                lambda _m, _i, out, i=index + 1: captured.__setitem__(i, out[0] if isinstance(out, tuple) else out)
            )
        )
    try:
        target.model(input_ids=tokens)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.cat([captured[i] for i in sorted(set(layer_ids))], dim=-1)


@dataclass(frozen=True, slots=True)
class TeacherPool:
    """The target's view of a fixed set of sequences, computed once: training then costs only the head's passes."""

    tokens: torch.Tensor  # [S, N] token ids
    aux: torch.Tensor  # [S, N, num_aux * h], bf16
    log_probs: torch.Tensor  # [S, N, vocab], the target's next-token log-probabilities, bf16


@torch.no_grad()
def teacher_pool(
    target: LlamaForCausalLM, sequences: torch.Tensor, layer_ids: tuple[int, ...] = AUX_LAYER_IDS, chunk: int = 32
) -> TeacherPool:
    aux, log_probs = [], []
    for part in sequences.split(chunk):
        aux.append(aux_hidden_states(target, part, layer_ids).to(torch.bfloat16))
        log_probs.append(F.log_softmax(target(input_ids=part).logits.float(), dim=-1).to(torch.bfloat16))
    return TeacherPool(sequences, torch.cat(aux), torch.cat(log_probs))


def pool_rows(pool: TeacherPool, batch_size: int, gen: torch.Generator) -> Iterator[torch.Tensor]:
    """Endless random batches of the pool's row indices."""
    while True:
        yield torch.randint(0, pool.tokens.size(0), (batch_size,), generator=gen)


def head_loss(pool: TeacherPool, steps: int, weight_decay: float) -> training.LossFn:
    """Forward KL(target || head) at every unrolled step, weighted ``weight_decay ** (step - 1)``; the loss's
    batch is a set of the pool's rows."""

    def loss(head: Eagle3Head, rows: torch.Tensor) -> torch.Tensor:
        tokens, aux, teacher = pool.tokens[rows], pool.aux[rows].float(), pool.log_probs[rows].float()
        total, weights = torch.zeros(()), 0.0
        for step, logits in enumerate(head.unroll(aux, tokens, steps), start=1):
            # Step j at anchor t predicts the token at t + j + 1: the target's distribution at position t + j.
            wanted = teacher[:, step : step + logits.size(1)]
            student = F.log_softmax(logits.float(), dim=-1)
            vocab = student.size(-1)
            kl = F.kl_div(student.reshape(-1, vocab), wanted.reshape(-1, vocab), log_target=True, reduction="batchmean")
            weight = weight_decay ** (step - 1)
            total, weights = total + weight * kl, weights + weight
        return total / weights

    return loss


@torch.no_grad()
def step_agreement(head: Eagle3Head, pool: TeacherPool, start: int, steps: int) -> list[float]:
    """Share of anchors from position ``start`` on where the head's step-j argmax is the target's, the earlier
    steps given right: on the target's greedy paths, the conditional acceptance of draft position j."""
    unrolled = head.unroll(pool.aux.float(), pool.tokens, steps)
    wanted = pool.log_probs.argmax(-1)
    return [
        (logits[:, start:].argmax(-1) == wanted[:, start + step : step + logits.size(1)]).float().mean().item()
        for step, logits in enumerate(unrolled, start=1)
    ]


def head_config(target_dir: Path) -> dict[str, object]:
    """The target's config turned into an EAGLE-3 head's, as vLLM's Eagle3LlamaForCausalLM reads it."""
    config = json.loads((target_dir / "config.json").read_text(encoding="utf-8"))
    config.update(
        architectures=["LlamaForCausalLMEagle3"],
        num_hidden_layers=1,
        draft_vocab_size=config["vocab_size"],
        target_hidden_size=config["hidden_size"],
        eagle_config={"eagle_aux_hidden_state_layer_ids": list(AUX_LAYER_IDS), "use_aux_hidden_state": True},
    )
    return config


def save_head(head: Eagle3Head, target_dir: Path, tokenizer: PreTrainedTokenizerFast, head_dir: Path) -> None:
    head_dir.mkdir(parents=True, exist_ok=True)
    weights = {name: tensor.to(SAVE_DTYPE).contiguous() for name, tensor in head.checkpoint().items()}
    save_file(weights, head_dir / "model.safetensors", metadata={"format": "pt"})
    (head_dir / "config.json").write_text(json.dumps(head_config(target_dir), indent=2) + "\n", encoding="utf-8")
    save_tokenizer(tokenizer, head_dir)


def new_head(target: LlamaForCausalLM, seed: int) -> Eagle3Head:
    """A seeded untrained head whose ``lm_head`` starts as the target's (both read the same residual stream)."""
    torch.manual_seed(seed)
    head = Eagle3Head(target.config, len(AUX_LAYER_IDS), target.model.embed_tokens.weight.float())
    for module in head.modules():
        if isinstance(module, torch.nn.Linear):
            torch.nn.init.normal_(module.weight, std=target.config.initializer_range)
    head.lm_head.weight.data.copy_(target.lm_head.weight.float())
    return head


def target_pools(
    target_dir: Path, recipe: HeadRecipe, seed: int, layer_ids: tuple[int, ...]
) -> tuple[LlamaForCausalLM, TeacherPool, TeacherPool]:
    """The target, its training pool (greedy continuations of corpus prefixes and corpus windows) and its
    evaluation pool (further greedy continuations), with aux states at ``layer_ids``."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(target_dir)
    data = training.token_stream(tokenizer, read_corpus())
    gen = torch.Generator().manual_seed(seed)

    def windows(batch_size: int) -> training.Batch:
        return training.corpus_windows(data, batch_size, recipe.seq_len, gen)

    with no_transformers_progress_bars():
        target = LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    target.requires_grad_(False)
    prefix_len = recipe.rollout_prefix_len
    rollouts = training.greedy_rollouts(target, windows(recipe.num_rollouts)[:, :prefix_len], recipe.seq_len)
    num_windows = round(recipe.num_rollouts * (1 - recipe.rollout_fraction) / recipe.rollout_fraction)
    pool = teacher_pool(target, torch.cat([rollouts, windows(num_windows)]), layer_ids)
    eval_paths = training.greedy_rollouts(target, windows(NUM_EVAL_PATHS)[:, :prefix_len], prefix_len + 64)
    return target, pool, teacher_pool(target, eval_paths, layer_ids)


def make_eagle3_head(
    out_dir: Path,
    target_dir: Path,
    *,
    seed: int = 0,
    progress: bool = True,
    recipe: HeadRecipe | None = None,
) -> HeadPaths:
    """Train an EAGLE-3 head for the target in ``target_dir`` and save it as ``out_dir/head`` (2-5 min)."""
    recipe = recipe or HeadRecipe()
    started, out_dir = time.monotonic(), Path(out_dir)

    with (
        torch_threads(HEAD_BUILD_THREADS),
        tqdm(total=recipe.steps, desc="rollouts", file=sys.stderr, disable=not progress) as bar,
    ):
        target, pool, eval_pool = target_pools(target_dir, recipe, seed, AUX_LAYER_IDS)
        bar.set_description("eagle3")
        head = new_head(target, seed)
        loss = training.train(
            head,
            pool_rows(pool, recipe.batch_size, torch.Generator().manual_seed(seed + 1)),
            head_loss(pool, TTT_STEPS, recipe.step_weight_decay),
            steps=recipe.steps,
            lr=recipe.lr,
            warmup_steps=recipe.warmup_steps,
            bar=bar,
        )
        agreement = step_agreement(head, eval_pool, recipe.rollout_prefix_len - 1, TTT_STEPS)
        paths = head_paths("eagle3", out_dir, target_dir)
        save_head(head, paths.target, PreTrainedTokenizerFast.from_pretrained(target_dir), paths.head)
    info = dict(
        kind="eagle3",
        seed=seed,
        target=str(target_dir),
        aux_layer_ids=list(AUX_LAYER_IDS),
        build_s=round(time.monotonic() - started, 1),
        loss=round(loss, 4),
        step_agreement=[round(a, 4) for a in agreement],
    )
    (out_dir / BUILD_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return paths
