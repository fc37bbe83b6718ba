"""Builders of tiny local target/draft model folders that vLLM loads like any Hugging Face model.

Four kinds of pair, each a folder ``<out>/target`` and ``<out>/draft`` sharing one tokenizer:

- ``trained``: a Llama target trained briefly on stdlib Python and a smaller draft distilled from it;
  with k=4, vLLM measures greedy acceptance 0.80 / 0.62 / 0.51 / 0.45 at positions 0-3 (mean
  acceptance length 3.4; see specserve.models.measure). Build: about 2 min on 2 cores, 8 where the CPU has no
  native bf16.
- ``self``: the draft is a copy of a random target, so every draft token is accepted.
- ``random``: a random target and an unrelated random draft, so almost nothing is accepted.
- ``perf``: a random draft and a target many times costlier per step built on the draft's layers, with
  a chosen agreement (specserve.models.perf); options ``size`` (S, M) and ``agreement`` (0..1).

Every builder is deterministic given its seed; ``self`` and ``random`` take a second or two.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

from specserve.models import training
from specserve.models.arguments import DEFAULT_AGREEMENT, DEFAULT_PERF_SIZE, KINDS
from specserve.models.tokenizer import read_corpus, save_tokenizer, train_tokenizer

# Bump when anything that changes the built files changes (shapes, recipe, corpus, tokenizer).
BUILD_VERSION = "v1"
BUILD_INFO_FILE = "specserve_build.json"
# Torch threads used while building; the dev machine has two cores.
BUILD_THREADS = 2
SAVE_DTYPE = torch.bfloat16  # what vLLM runs (dtype="bfloat16"), and half the size of fp32

# Llama shapes. Both have head_dim 64 and share the vocabulary; the draft costs ~1/5 of the target.
TARGET_SHAPE = dict(
    hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, intermediate_size=512
)
DRAFT_SHAPE = dict(
    hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=256
)
MAX_POSITION_EMBEDDINGS = 2048

# Corpus prefixes whose target continuations give the build's acceptance estimate.
NUM_EVAL_PREFIXES = 32


@dataclass(frozen=True, slots=True)
class PairPaths:
    """A built pair: pass ``target`` as vLLM's model and ``draft`` as speculative_config["model"]."""

    target: Path
    draft: Path

    @classmethod
    def under(cls, out_dir: Path) -> PairPaths:
        return cls(target=Path(out_dir) / "target", draft=Path(out_dir) / "draft")


def llama_config(shape: dict, tokenizer: PreTrainedTokenizerFast) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **shape,
    )


def random_model(shape: dict, tokenizer: PreTrainedTokenizerFast, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(llama_config(shape, tokenizer)).eval()


def save_model(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, model_dir: Path) -> None:
    """Write config, bf16 safetensors, generation config, tokenizer files and chat template."""
    model_dir.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with no_transformers_progress_bars():  # they would interleave with the build's own bar
        model.to(SAVE_DTYPE).save_pretrained(model_dir, safe_serialization=True)
    save_tokenizer(tokenizer, model_dir)


def write_build_info(out_dir: Path, kind: str, seed: int, started_s: float, **extra: object) -> None:
    info = dict(kind=kind, version=BUILD_VERSION, seed=seed, build_s=round(time.monotonic() - started_s, 1), **extra)
    (out_dir / BUILD_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


@contextmanager
def torch_threads(num_threads: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@contextmanager
def no_transformers_progress_bars() -> Iterator[None]:
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def make_self_pair(out_dir: Path, *, seed: int = 0, progress: bool = False) -> PairPaths:
    """Random target; the draft is a byte-for-byte copy of it, so acceptance is 1.0."""
    started, paths = time.monotonic(), PairPaths.under(out_dir)
    tokenizer = train_tokenizer(read_corpus(), model_max_length=MAX_POSITION_EMBEDDINGS)
    with torch_threads(BUILD_THREADS):
        save_model(random_model(TARGET_SHAPE, tokenizer, seed), tokenizer, paths.target)
    shutil.copytree(paths.target, paths.draft)
    write_build_info(Path(out_dir), "self", seed, started)
    return paths


def make_random_pair(out_dir: Path, *, seed: int = 0, progress: bool = False) -> PairPaths:
    """Random target and an independently random draft, so acceptance is about 0."""
    started, paths = time.monotonic(), PairPaths.under(out_dir)
    tokenizer = train_tokenizer(read_corpus(), model_max_length=MAX_POSITION_EMBEDDINGS)
    with torch_threads(BUILD_THREADS):
        save_model(random_model(TARGET_SHAPE, tokenizer, seed), tokenizer, paths.target)
        save_model(random_model(DRAFT_SHAPE, tokenizer, seed + 1), tokenizer, paths.draft)
    write_build_info(Path(out_dir), "random", seed, started)
    return paths


def make_trained_pair(
    out_dir: Path, *, seed: int = 0, progress: bool = True, recipe: training.TrainRecipe | None = None
) -> PairPaths:
    """Train a target on stdlib Python, distill a draft from it, and save both (2-8 min)."""
    recipe = recipe or training.TrainRecipe()
    started, paths = time.monotonic(), PairPaths.under(out_dir)
    texts = read_corpus()
    tokenizer = train_tokenizer(texts, model_max_length=MAX_POSITION_EMBEDDINGS)
    data = training.token_stream(tokenizer, texts)
    gen = torch.Generator().manual_seed(seed)

    def windows(batch_size: int) -> training.Batch:
        return training.corpus_windows(data, batch_size, recipe.seq_len, gen)

    with (
        torch_threads(BUILD_THREADS),
        tqdm(
            total=recipe.target_steps + recipe.draft_steps, desc="target", file=sys.stderr, disable=not progress
        ) as bar,
    ):
        target = random_model(TARGET_SHAPE, tokenizer, seed)
        target_loss = training.train(
            target,
            training.forever(lambda: windows(recipe.batch_size)),
            training.lm_loss,
            steps=recipe.target_steps,
            lr=recipe.target_lr,
            warmup_steps=recipe.warmup_steps,
            bar=bar,
        )
        bar.set_description("rollouts")
        prefixes = windows(recipe.num_rollouts)[:, : recipe.rollout_prefix_len]
        rollouts = training.greedy_rollouts(target, prefixes, recipe.seq_len)
        bar.set_description("draft")
        draft = random_model(DRAFT_SHAPE, tokenizer, seed + 1)
        batches = training.mixed_batches(rollouts, windows, recipe.batch_size, recipe.rollout_fraction, gen)
        draft_loss = training.train(
            draft,
            batches,
            training.distill_loss(target),
            steps=recipe.draft_steps,
            lr=recipe.draft_lr,
            warmup_steps=recipe.warmup_steps,
            bar=bar,
        )

        target, draft = target.to(SAVE_DTYPE), draft.to(SAVE_DTYPE)
        eval_prefixes = windows(NUM_EVAL_PREFIXES)[:, : recipe.rollout_prefix_len]
        agreement = training.greedy_agreement(target, draft, eval_prefixes, recipe.rollout_prefix_len + 64)
        save_model(target, tokenizer, paths.target)
        save_model(draft, tokenizer, paths.draft)
    write_build_info(
        Path(out_dir),
        "trained",
        seed,
        started,
        target_loss=round(target_loss, 4),
        draft_kl=round(draft_loss, 4),
        greedy_agreement_bf16=round(agreement, 4),
    )
    return paths


def make_perf_pair(out_dir: Path, **kwargs: Any) -> PairPaths:
    from specserve.models import perf  # it builds on this module

    return perf.make_perf_pair(out_dir, **kwargs)


PairBuilder = Callable[..., PairPaths]
# The pair kinds by name; `make_pair` and the cache accept exactly these.
BUILDERS: dict[str, PairBuilder] = {
    "trained": make_trained_pair,
    "self": make_self_pair,
    "random": make_random_pair,
    "perf": make_perf_pair,
}
assert tuple(sorted(BUILDERS)) == KINDS, "specserve.models.arguments.KINDS lists the builders for the CLI"
# Options a kind's builder takes beyond seed and progress, with their defaults.
OPTION_DEFAULTS: dict[str, dict[str, Any]] = {"perf": {"size": DEFAULT_PERF_SIZE, "agreement": DEFAULT_AGREEMENT}}


def pair_options(kind: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` checked against ``kind``, with that kind's defaults filled in."""
    if kind not in BUILDERS:
        raise ValueError(f"unknown model pair kind {kind!r}; expected one of {sorted(BUILDERS)}")
    defaults = OPTION_DEFAULTS.get(kind, {})
    if unknown := sorted(set(options) - set(defaults)):
        raise ValueError(f"model pair kind {kind!r} takes no option {', '.join(map(repr, unknown))}")
    return {**defaults, **options}


def make_pair(kind: str, out_dir: Path, *, seed: int = 0, progress: bool = True, **options: Any) -> PairPaths:
    """Build the pair named ``kind`` (one of BUILDERS) under ``out_dir``; ``options`` as OPTION_DEFAULTS."""
    options = pair_options(kind, options)
    return BUILDERS[kind](Path(out_dir), seed=seed, progress=progress, **options)
