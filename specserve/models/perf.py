"""The ``perf`` pair: a target many times costlier per step than its draft, with a chosen agreement.

The draft is a small random Llama. The target is the draft's own layers followed by extra layers of
the same width whose residual writes (``o_proj``, ``down_proj``) are scaled by a strength: at
strength 0 the extra layers add nothing and the target computes exactly the draft's function (greedy
agreement 1); larger strengths push the target's argmax away from the draft's. The build searches
the strength until the greedy agreement, measured in torch along the target's own greedy
continuations of corpus prefixes (what vLLM's position-0 acceptance counts), is close to the asked
value, then measures it again on other prefixes and records that in the build info.

The weights are random, so the text is gibberish; the pair exists to make step time and acceptance
behave like a real pair's: a target whose step is dominated by streaming its weights, a cheap draft.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from specserve.models import training
from specserve.models.arguments import PERF_SIZE_NAMES
from specserve.models.build import (
    BUILD_THREADS,
    MAX_POSITION_EMBEDDINGS,
    SAVE_DTYPE,
    PairPaths,
    llama_config,
    random_model,
    save_model,
    torch_threads,
    write_build_info,
)
from specserve.models.tokenizer import read_corpus, train_tokenizer


@dataclass(frozen=True, slots=True)
class PerfSize:
    """Shapes of one perf pair; target and draft share the width, the target has ``extra_layers`` more."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    draft_layers: int
    extra_layers: int

    def shape(self, num_layers: int) -> dict:
        return dict(
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            num_hidden_layers=num_layers,
        )


_SIZE_S = PerfSize(
    hidden_size=1024,
    intermediate_size=2816,
    num_attention_heads=16,
    num_key_value_heads=4,
    draft_layers=1,
    extra_layers=16,
)
PERF_SIZES: dict[str, PerfSize] = {
    "S": _SIZE_S,
    # S's draft (the same shapes and seed give the same weights) under a target twice as deep.
    "M": dataclasses.replace(_SIZE_S, extra_layers=32),
}
assert tuple(PERF_SIZES) == PERF_SIZE_NAMES, "specserve.models.arguments.PERF_SIZE_NAMES lists the sizes"


@dataclass(frozen=True, slots=True)
class Calibration:
    """How the strength is searched. Changing a default changes the built weights (bump BUILD_VERSION)."""

    # Corpus prefixes of prefix_len tokens, each continued greedily by the target for new_tokens tokens;
    # the final measurement uses eval_prefixes other prefixes.
    num_prefixes: int = 32
    eval_prefixes: int = 64
    prefix_len: int = 16
    new_tokens: int = 32
    # The search stops this close to the asked agreement (the measurement itself moves by about as
    # much between prefix sets), or after max_steps measurements.
    tolerance: float = 0.02
    max_steps: int = 8
    # The strength is searched between 2**min_log2 (agreement about 1) and 2**max_log2 (about 0).
    min_log2: float = -12.0
    max_log2: float = 4.0


# Residual writes of an extra layer: scaling these scales what the layer adds to the residual stream.
RESIDUAL_WRITES = ("self_attn.o_proj", "mlp.down_proj")


def make_perf_pair(
    out_dir: Path,
    *,
    size: str = "S",
    agreement: float = 0.8,
    seed: int = 0,
    progress: bool = False,
    calibration: Calibration | None = None,
) -> PairPaths:
    """Build the perf pair of ``size`` whose greedy agreement is about ``agreement`` (0..1)."""
    if size not in PERF_SIZES:
        raise ValueError(f"unknown perf pair size {size!r}; expected one of {sorted(PERF_SIZES)}")
    if not 0.0 <= agreement <= 1.0:
        raise ValueError(f"agreement must be between 0 and 1, got {agreement!r}")
    calibration = calibration or Calibration()
    started, paths, dims = time.monotonic(), PairPaths.under(out_dir), PERF_SIZES[size]
    texts = read_corpus()
    tokenizer = train_tokenizer(texts, model_max_length=MAX_POSITION_EMBEDDINGS)
    data = training.token_stream(tokenizer, texts)
    gen = torch.Generator().manual_seed(seed)
    calibrate_on, evaluate_on = (
        training.corpus_windows(data, n, calibration.prefix_len, gen)
        for n in (calibration.num_prefixes, calibration.eval_prefixes)
    )
    total_len = calibration.prefix_len + calibration.new_tokens

    with torch_threads(BUILD_THREADS):
        draft = random_model(dims.shape(dims.draft_layers), tokenizer, seed).to(SAVE_DTYPE)
        target, writes = stacked_target(draft, dims, tokenizer, seed + 1)

        def measure(strength: float, prefixes: torch.Tensor) -> float:
            set_strength(writes, strength)
            return training.greedy_agreement(target, draft, prefixes, total_len)

        strength, steps = find_strength(lambda s: measure(s, calibrate_on), agreement, calibration)
        measured = measure(strength, evaluate_on)
        save_model(target, tokenizer, paths.target)
        save_model(draft, tokenizer, paths.draft)
    write_build_info(
        Path(out_dir),
        "perf",
        seed,
        started,
        size=size,
        target_layers=dims.draft_layers + dims.extra_layers,
        draft_layers=dims.draft_layers,
        hidden_size=dims.hidden_size,
        intermediate_size=dims.intermediate_size,
        agreement_requested=agreement,
        strength=strength,
        calibration_steps=steps,
        greedy_agreement_bf16=round(measured, 4),
    )
    return paths


def stacked_target(
    draft: LlamaForCausalLM, dims: PerfSize, tokenizer: PreTrainedTokenizerFast, seed: int
) -> tuple[LlamaForCausalLM, list[tuple[torch.nn.Linear, torch.Tensor]]]:
    """The draft's embedding, layers, norm and head, then ``dims.extra_layers`` random layers; returns it
    with the extra layers' residual-write projections and their unscaled weights."""
    torch.manual_seed(seed)
    target = LlamaForCausalLM(llama_config(dims.shape(dims.draft_layers + dims.extra_layers), tokenizer))
    target = target.to(SAVE_DTYPE).eval()
    layers = target.model.layers
    for i, layer in enumerate(draft.model.layers):
        layers[i].load_state_dict(layer.state_dict())
    target.model.embed_tokens.load_state_dict(draft.model.embed_tokens.state_dict())
    target.model.norm.load_state_dict(draft.model.norm.state_dict())
    target.lm_head.load_state_dict(draft.lm_head.state_dict())
    writes = [
        (layer.get_submodule(name), layer.get_submodule(name).weight.detach().clone())
        for layer in layers[dims.draft_layers :]
        for name in RESIDUAL_WRITES
    ]
    return target, writes


def set_strength(writes: list[tuple[torch.nn.Linear, torch.Tensor]], strength: float) -> None:
    with torch.no_grad():
        for linear, base in writes:
            linear.weight.copy_((base.float() * strength).to(linear.weight.dtype))


def find_strength(agreement_at: Callable[[float], float], wanted: float, calibration: Calibration) -> tuple[float, int]:
    """The strength whose measured agreement is closest to ``wanted``, and how many measurements it took.

    Agreement falls from 1 to about 0 as log2(strength) grows, roughly like a logistic curve, so each
    step interpolates linearly in logit(agreement) over log2(strength) inside the current bracket
    (kept off the bracket's ends so that the bracket shrinks). Measurements are noisy, so the closest
    one seen wins rather than the last."""
    if wanted >= 1.0:
        return 0.0, 0
    lo, hi = calibration.min_log2, calibration.max_log2
    at_lo, at_hi = 1.0, 0.0  # assumed at the ends, not measured
    best = (abs(1.0 - wanted), 0.0)  # (|error|, strength): strength 0 agrees exactly
    steps = 0
    while steps < calibration.max_steps and best[0] > calibration.tolerance:
        share = (_logit(at_lo) - _logit(wanted)) / (_logit(at_lo) - _logit(at_hi))
        x = lo + min(max(share, 0.15), 0.85) * (hi - lo)
        got, steps = agreement_at(2.0**x), steps + 1
        best = min(best, (abs(got - wanted), 2.0**x))
        if got > wanted:
            lo, at_lo = x, got
        else:
            hi, at_hi = x, got
    return best[1], steps


def _logit(p: float) -> float:
    p = min(max(p, 0.01), 0.99)
    return math.log(p / (1 - p))
