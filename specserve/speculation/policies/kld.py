"""DSDE (arXiv 2509.01083): per-sequence k from KL-divergence stability, with a batch cap on stragglers.

DSDE §III (§III-A: Eqs. 1-8; §III-C: Eqs. 9-11). Each sequence first runs ``calib_steps`` speculative steps at
``calib_k`` to calibrate its own SL_max (Eq. 1); afterwards, each step's SL-hat is

    SL-hat = (1 - SF * WVIR) * (SL_max - SL_min) + SL_min     (Eqs. 2, 8; SL_min once SF * WVIR > 1)

with SF = exp(2 mu_last) - 1 from the last step's mean KLD (Eq. 3) and WVIR the short/long weighted
variance ratio of the per-step KLD history (Eqs. 4-7). The batch cap SL_cap is the mean SL-hat over the
running sequences (Eqs. 9-11), and each sequence gets clamp(round(min(SL-hat, SL_cap)), SL_min,
floor(SL_max)) (the paper does not say how it rounds: we round to nearest after the min). The batch-wide
``Decision.k`` is the largest per-sequence length (the draft depth, at most round(SL_cap)); lengths below it go
out as ``Decision.max_k_per_request``. Sequences still calibrating count with SL-hat = calib_k in the cap (our
choice; the paper does not say). Formulas live in ``parts.kld_signals``.

**Fallback.** DSDE needs per-position KL(target || draft) for every drafted token, keyed by request id
(``StepRecord.kl_per_request`` and ``request_ids``) and the running ids in ``StepContext.request_ids``. The
vLLM engine provides none of them yet. Until a step with KL values has been observed, and whenever the
context carries no request ids, this policy behaves exactly like ``goodput:max_k=4``
(TurboSpec's ArgMaxGoodput, which it feeds every record), so on the vLLM engine ``kld`` is ``goodput:max_k=4``.

Not modelled: the clamp "under budget constraints (remaining max_tokens and context capacity)" (§III-B; the
context does not carry them) and the entropy combination the paper mentions without a formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specserve.speculation.policies.goodput import GoodputParams, GoodputPolicy
from specserve.speculation.policies.parts.kld_signals import (
    SequenceKld,
    batch_cap,
    predicted_length,
    round_half_up,
    scale_factor,
    wvir,
)
from specserve.speculation.policy import Policy, register
from specserve.speculation.types import Decision, EngineTraits, StepContext, StepRecord


@dataclass(frozen=True, slots=True)
class KldParams:
    # SL_min: DSDE never drafts fewer per sequence, so it never turns speculation off (§III-A: "fixed at 2").
    sl_min: int = 2
    # delta of Eq. 5, the per-step decay of the history weights (the paper's example value).
    decay: float = 0.85
    # Windows of Eq. 4 in verification steps (§IV-B: "lagging mean KLD over the previous 10 steps"; 30 long).
    short_window: int = 10
    long_window: int = 30
    # Calibration steps per sequence before Eq. 1 (the paper: "a small, fixed number"; 5 is our choice).
    calib_steps: int = 5
    # Drafts per calibration step; bounds SL_max <= 2 * calib_k (the paper gives none; 8 is our choice). Capped by
    # the engine's max_k.
    calib_k: int = 8
    # Apply SL_cap (Eqs. 9-11); false is the uncapped strategy of §IV-E, Fig. 9.
    cap: bool = True

    def __post_init__(self) -> None:
        if self.sl_min < 1:
            raise ValueError(f"sl_min={self.sl_min} must be at least 1")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"decay={self.decay} must lie in (0, 1]")
        if self.short_window < 2:
            raise ValueError(f"short_window={self.short_window} must be at least 2")
        if self.long_window < self.short_window:
            raise ValueError(f"long_window={self.long_window} must be at least short_window={self.short_window}")
        if self.calib_steps < 1:
            raise ValueError(f"calib_steps={self.calib_steps} must be at least 1")
        if self.calib_k < self.sl_min:
            raise ValueError(f"calib_k={self.calib_k} must be at least sl_min={self.sl_min}")


@register
class KldPolicy(Policy):
    """Per-sequence SL from KLD stability (DSDE), capped at the batch mean; goodput without KL signals."""

    name = "kld"
    Params = KldParams

    def __init__(self, params: KldParams, traits: EngineTraits) -> None:
        super().__init__(params, traits)
        # 0..4: goodput's cap before it followed the engine's max_k, which DSDE's runs (max_k 10) were made with.
        self.fallback = GoodputPolicy(GoodputParams(max_k=4), traits)
        self._sequences: dict[str, SequenceKld] = {}
        # Sticky: the engine produces KL values. Until then (and on the vLLM engine, always) use the fallback.
        self.kl_seen = False
        self._last_cap = 0.0

    def choose(self, ctx: StepContext) -> Decision:
        if not self.kl_seen or not ctx.request_ids:
            return self.fallback.choose(ctx)
        if not ctx.draft_resident or ctx.num_running == 0:
            return Decision(k=0)
        if len(self._sequences) > len(ctx.request_ids):
            running = set(ctx.request_ids)
            self._sequences = {r: s for r, s in self._sequences.items() if r in running}
        predictions = [self._predicted(rid) for rid in ctx.request_ids]
        cap = batch_cap(predictions) if self.params.cap else math.inf
        self._last_cap = cap
        lengths = [self._final_length(rid, p, cap) for rid, p in zip(ctx.request_ids, predictions, strict=True)]
        k = max(lengths)
        return Decision(
            k=k, max_k_per_request=tuple((r, n) for r, n in zip(ctx.request_ids, lengths, strict=True) if n < k)
        )

    def observe(self, record: StepRecord) -> None:
        self.fallback.observe(record)
        if not record.kl_per_request or not record.request_ids:
            return  # KL values without ids cannot be kept per sequence
        self.kl_seen = True
        for rid, klds, num_accepted in zip(
            record.request_ids, record.kl_per_request, record.num_accepted_per_request, strict=True
        ):
            if not klds:
                continue
            state = self._sequences.get(rid)
            if state is None:
                state = self._sequences[rid] = SequenceKld(self.params.calib_steps, self.params.long_window)
            state.observe(klds, num_accepted)
            if state.max_length is not None:
                state.predicted = self._prediction(state)

    def sequence(self, request_id: str) -> SequenceKld | None:
        """The DSDE state kept for one request, for inspection."""
        return self._sequences.get(request_id)

    def describe(self) -> dict[str, float]:
        out = {"kl_seen": float(self.kl_seen), "num_sequences": float(len(self._sequences))}
        if self.kl_seen:
            out["sl_cap"] = self._last_cap
        return out

    def _prediction(self, state: SequenceKld) -> float:
        history = list(state.history)
        ratio = wvir(history, self.params.decay, self.params.short_window, self.params.long_window)
        # A calibration that accepted nothing gives SL_max = 0 < SL_min; the paper is silent, we floor it at SL_min.
        max_length = max(state.max_length or 0.0, float(self.params.sl_min))
        return predicted_length(scale_factor(history[0]), ratio, max_length, self.params.sl_min)

    def _predicted(self, request_id: str) -> float:
        state = self._sequences.get(request_id)
        if state is None or state.predicted is None:
            return float(self._calib_k())
        return state.predicted

    def _final_length(self, request_id: str, predicted: float, cap: float) -> int:
        state = self._sequences.get(request_id)
        if state is None or state.max_length is None:
            ceiling = self._calib_k()
        else:
            ceiling = max(math.floor(state.max_length), self.params.sl_min)
        length = min(max(round_half_up(min(predicted, cap)), self.params.sl_min), ceiling)
        return min(length, self.traits.max_k)

    def _calib_k(self) -> int:
        return min(self.params.calib_k, self.traits.max_k)
