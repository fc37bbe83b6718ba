"""Step latency: how long one engine step takes, from a fitted linear model or a roofline.

A step is (TurboSpec §4.1.3, Eq. 2) T_step = overhead + T_target + sum over draft passes T_draft.
Each forward pass is priced by a ``ForwardCost``:

- ``LinearForward``: TurboSpec Eq. 3, T = a * N_context + b * N_batched + c, coefficients from a profile.
- ``RooflineForward``: T = overhead + num_layers * t_layer + max(bytes read / bandwidth, FLOPs / peak)
  + all-reduces, where bytes read are the weights plus the KV cache of every cached context token, and
  FLOPs are 2 * params per batched token (attention FLOPs are left out: at serving context lengths decode
  attention is bound by the KV read counted above). Tensor parallelism divides weights, KV and FLOPs by TP
  and adds two ring all-reduces per layer (after attention and after the MLP) of N_batched * hidden *
  dtype bytes each. Worked example (test_sim_models): Llama-2-7B on H100, 50 requests with 300 cached
  tokens each: weights 13.5 GB + KV 7.9 GB at 0.8 * 3.35 TB/s = 8.0 ms, + 0.3 ms + 32 * 5 us, against
  TurboSpec's measured 7.4 ms (§3 Fig. 2; its context length is not given).

The per-layer cost t_layer is work every layer does whatever its size: under CUDA graphs the small kernels
(norms, rotary, activation, residual adds), 5 us; in an eager engine (vLLM enforce_eager) the Python
dispatch of each layer's kernels, 90 us, added rather than overlapped. Both are fitted to the papers' step
times by ``python -m lab latency-check`` (latency_check.py, bench/results/latency-check.md): SpecKV's five
eager step times (SpecKV §5.1) sat at 0.73-0.76 of the measured without it and 0.98-1.04 with it; under CUDA graphs
the fit is flat from 0 to about 10 us, bounded by a vLLM V1 batch-1 decode rate (vLLM PR #16937).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from specserve.sim.config import LatencyConfig
from specserve.sim.profiles import HardwareProfile, LinearFit, ModelProfile


class ForwardCost(Protocol):
    # Token counts may be fractional: latency-check prices mean batches and contexts (lab/experiments/).
    def forward_s(self, num_context_tokens: float, num_batched_tokens: float) -> float: ...


@dataclass(frozen=True, slots=True)
class LinearForward:
    s_per_context_token: float
    s_per_batched_token: float
    intercept_s: float

    @classmethod
    def from_fit(cls, fit: LinearFit) -> LinearForward:
        return cls(fit.s_per_context_token, fit.s_per_batched_token, fit.intercept_s)

    def forward_s(self, num_context_tokens: float, num_batched_tokens: float) -> float:
        return (
            self.s_per_context_token * num_context_tokens
            + self.s_per_batched_token * num_batched_tokens
            + self.intercept_s
        )


@dataclass(frozen=True, slots=True)
class RooflineForward:
    # Per GPU of the TP group: each rank holds 1/TP of the weights and of every token's KV.
    weight_bytes: float
    kv_bytes_per_token: float
    flops_per_token: float
    # Achievable rates (datasheet peak times an efficiency).
    bytes_per_s: float
    flops_per_s: float
    # Kernel launches and framework work per forward pass.
    overhead_s: float
    # num_layers * the per-layer cost: work in every layer that does not scale with bytes or FLOPs.
    layers_s: float
    # Two all-reduces per layer when TP > 1, else 0.
    num_allreduces: int
    # Seconds per batched token of all-reduce traffic: hidden * dtype bytes * 2 (TP-1)/TP / bus bandwidth.
    allreduce_s_per_token: float
    allreduce_latency_s: float

    def forward_s(self, num_context_tokens: float, num_batched_tokens: float) -> float:
        memory_s = (self.weight_bytes + self.kv_bytes_per_token * num_context_tokens) / self.bytes_per_s
        compute_s = self.flops_per_token * num_batched_tokens / self.flops_per_s
        comm_s = self.num_allreduces * (self.allreduce_latency_s + self.allreduce_s_per_token * num_batched_tokens)
        return self.overhead_s + self.layers_s + max(memory_s, compute_s) + comm_s


def roofline_forward(
    model: ModelProfile,
    hardware: HardwareProfile,
    tp: int,
    bandwidth_efficiency: float,
    flops_efficiency: float,
    overhead_s: float,
    layer_s: float = 0.0,
) -> RooflineForward:
    ring_factor = 2.0 * (tp - 1) / tp
    return RooflineForward(
        weight_bytes=model.weight_bytes / tp,
        kv_bytes_per_token=model.kv_bytes_per_token / tp,
        flops_per_token=2.0 * model.params / tp,
        bytes_per_s=hardware.memory_bandwidth_gb_s * 1e9 * bandwidth_efficiency,
        flops_per_s=hardware.peak_tflops * 1e12 * flops_efficiency,
        overhead_s=overhead_s,
        layers_s=model.num_layers * layer_s,
        num_allreduces=2 * model.num_layers if tp > 1 else 0,
        allreduce_s_per_token=model.hidden_size * model.dtype_bytes * ring_factor / (hardware.interconnect_gb_s * 1e9),
        allreduce_latency_s=hardware.allreduce_latency_s,
    )


def roofline_timer(
    cfg: LatencyConfig, hardware: HardwareProfile, target: ModelProfile, draft: ModelProfile, tp: int
) -> StepTimer:
    """The step timer a roofline scenario runs on; the draft runs unsharded on one GPU (draft TP 1)."""
    layer_s = cfg.layer_overhead_s if cfg.cuda_graphs else cfg.eager_layer_overhead_s
    effs = (cfg.bandwidth_efficiency, cfg.flops_efficiency, cfg.forward_overhead_s, layer_s)
    return StepTimer(
        roofline_forward(target, hardware, tp, *effs),
        roofline_forward(draft, hardware, 1, *effs),
        cfg.step_overhead_s,
    )


@dataclass(frozen=True, slots=True)
class StepTimer:
    """Prices a whole step: engine overhead, one target pass, and the draft's passes."""

    target: ForwardCost
    draft: ForwardCost
    # Scheduling, sampling and output processing per step, outside any forward pass.
    step_overhead_s: float
    # What a step that verifies drafts adds outside the forward passes, whatever k is: rejection sampling, the
    # speculative metadata, the proposer's set-up. Fitted on CPU engines (engine_check), where it is about one
    # plain step's cost; the roofline profiles fold it into step_overhead_s and leave it 0.
    speculation_overhead_s: float = 0.0
    # Spread of measured step times around this model: each simulated step's time is multiplied by a lognormal
    # factor of mean 1 and this log-sigma (``jitter``). 0 (the GPU profiles): every step costs exactly its price.
    # A CPU engine sharing its cores with the HTTP path spreads same-shaped steps by 40-70 % (engine_check fits it).
    jitter_sigma: float = 0.0

    def jitter(self, rng: np.random.Generator) -> float:
        """One step's factor on its modelled time: 1 without jitter, else lognormal with mean 1."""
        if self.jitter_sigma <= 0.0:
            return 1.0
        return float(rng.lognormal(-0.5 * self.jitter_sigma**2, self.jitter_sigma))

    def step_s(
        self,
        num_context_tokens: float,
        num_batched_tokens: float,
        draft_pass_tokens: Sequence[float],
        target_context_tokens: float | None = None,
        verifies: bool = False,
    ) -> float:
        """Seconds for one step; ``draft_pass_tokens`` holds the tokens of each draft pass, in order.

        The draft's first pass consumes the tokens new to it (prefill chunks, last step's bonus tokens,
        and any catch-up after steps it skipped); each further pass proposes one token per request still
        drafting (drafting.py). The draft reads the cached context once per pass; the target reads it once
        unless ``target_context_tokens`` says otherwise (a batch-expansion scorer). Empty: no draft pass.
        ``verifies``: the step verifies drafted tokens (and pays ``speculation_overhead_s``).
        """
        return sum(
            self.step_parts(num_context_tokens, num_batched_tokens, draft_pass_tokens, target_context_tokens, verifies)
        )

    def step_parts(
        self,
        num_context_tokens: float,
        num_batched_tokens: float,
        draft_pass_tokens: Sequence[float],
        target_context_tokens: float | None = None,
        verifies: bool = False,
    ) -> tuple[float, float, float]:
        """``step_s`` in its parts, as an engine times them (``StepRecord.forward_s`` and ``draft_s``): the target's
        pass, the draft's passes, and the rest of the step (its overheads)."""
        target_context = num_context_tokens if target_context_tokens is None else target_context_tokens
        forward_s = self.target.forward_s(target_context, num_batched_tokens)
        # Passes after the first carry the same tokens: a count like the pass before's is priced once.
        passes_s, last_n, last_s = [], None, 0.0
        for n in draft_pass_tokens:
            if n != last_n:
                last_n, last_s = n, self.draft.forward_s(num_context_tokens, n)
            passes_s.append(last_s)
        draft_s = sum(passes_s)
        rest_s = self.step_overhead_s + (self.speculation_overhead_s if verifies else 0.0)
        return forward_s, float(draft_s), rest_s
