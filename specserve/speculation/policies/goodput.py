"""TurboSpec's ArgMaxGoodput: each step, the k that maximises predicted tokens per second.

research/turbospec.md §2.2 (goodput), §2.3 (latency model), §2.4 (acceptance), §2.5 (Listing 2 with
the k = 0 candidate restored), §2.11 (defaults). Predicted goodput for candidate k with B decoding
requests:

    goodput(k) = B * l(k) / T_step(k)

where l(k) is the expected tokens per request (Eq. 4, per position) and T_step is the online latency
model evaluated with B * (k + 1) decode tokens and k draft passes (one at k = 0 on engines whose k = 0 still
syncs the draft, research/feasibility-2.md).

The step's prefill chunk is left out of T_step. TurboSpec never speculates in prefill steps (§2.6); under
chunked prefill (vLLM V1) a chunk rides along with the decodes whatever k is, so its time is not a cost of k.
Charged to the decodes it acts like a huge fixed cost that speculation seems to amortise: with a saturated
8192-token budget (a 7B target on an RTX 4090 at 30 QPS, bench/scenarios/) every step takes ~1.3 s, k = 4 looks
~2.4x better than k = 0 yet fixed k = 4 has 16% less throughput: its drafts only displace prefill tokens.

Two guards keep the online fit honest (research/turbospec.md §2.3 fits offline over a grid instead): a step
at a neighbouring k once per ``explore_interval_s`` (probe.NeighbourExplorer), and the periodic probe at k = 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from specserve.speculation.estimators.acceptance import PositionAcceptance
from specserve.speculation.estimators.step_latency import StepLatencyModel
from specserve.speculation.policy import Policy, register
from specserve.speculation.policies.parts.probe import NeighbourExplorer, ZeroProbe
from specserve.speculation.policies.parts.ties import argmax_smallest as best_k
from specserve.speculation.types import Decision, EngineTraits, StepContext, StepRecord



@dataclass(frozen=True, slots=True)
class GoodputParams:
    # MAX_LEN of Listing 2; the search is 0..min(k_max, engine max_k).
    k_max: int = 4
    # Acceptance EWMA half-life in speculative steps (§2.11: "tens of steps").
    ema_half_life_steps: float = 20.0
    # Acceptance assumed before any sample (§2.11: 0.5-0.7 for the cold start).
    prior_alpha: float = 0.5
    # Seconds of continuous k = 0 after which one step speculates to refresh acceptance.
    probe_interval_s: float = 2.0
    # The k of a probe step: 1 buys a position-0 sample per request at the least cost.
    probe_k: int = 1
    # Latency fit half-life in steps: step cost drifts slowly, and k varies rarely once settled.
    latency_half_life_steps: float = 1000.0
    # Relative goodput a k > 0 must add over k = 0 to turn speculation on. Where k = 1 costs about
    # what k = 0 costs (vLLM's k = 0 still runs a draft pass), the acceptance prior alone would
    # otherwise keep a useless draft speculating; 2% is below any gain worth a draft.
    min_gain: float = 0.02
    # Seconds of continuous speculation between single steps at k - 1 or k + 1 (alternating; only down at
    # k_max; never from k = 0, where the probe runs). Without them a settled k leaves the latency fit blind
    # to the cost of k (probe.NeighbourExplorer). At 10-50 ms steps 1 s costs 1-5% of steps at a k next to
    # the best. math.inf ("inf") turns exploration off.
    explore_interval_s: float = 1.0

    def __post_init__(self) -> None:
        if self.k_max < 0:
            raise ValueError(f"k_max={self.k_max} must be non-negative")
        if not self.ema_half_life_steps > 0:
            raise ValueError(f"ema_half_life_steps={self.ema_half_life_steps} must be positive")
        if not 0.0 <= self.prior_alpha <= 1.0:
            raise ValueError(f"prior_alpha={self.prior_alpha} must lie in [0, 1]")
        if not self.probe_interval_s > 0:
            raise ValueError(f"probe_interval_s={self.probe_interval_s} must be positive")
        if self.probe_k < 1:
            raise ValueError(f"probe_k={self.probe_k} must be at least 1")
        if not self.latency_half_life_steps > 0:
            raise ValueError(f"latency_half_life_steps={self.latency_half_life_steps} must be positive")
        if not 0.0 <= self.min_gain < 1.0:
            raise ValueError(f"min_gain={self.min_gain} must lie in [0, 1)")
        if not self.explore_interval_s > 0:
            raise ValueError(f"explore_interval_s={self.explore_interval_s} must be positive")


@register
class GoodputPolicy(Policy):
    """Argmax of predicted goodput over k, with a periodic probe while the argmax is 0 and a periodic step
    at a neighbouring k while it is not."""

    name = "goodput"
    Params = GoodputParams

    def __init__(self, params: GoodputParams, traits: EngineTraits, latency: StepLatencyModel | None = None) -> None:
        super().__init__(params, traits)
        # Largest k searched: the engine's buffers cap what the user asked for.
        self.limit_k = min(params.k_max, traits.max_k)
        self.acceptance = PositionAcceptance(
            max_k=max(1, self.limit_k), half_life_steps=params.ema_half_life_steps, prior_alpha=params.prior_alpha
        )
        # Injectable so a profiled fit (profiles are data) can seed the prior; the default is generic.
        if latency is None:
            latency = StepLatencyModel(half_life_steps=params.latency_half_life_steps)
        self.latency = latency
        self.probe = ZeroProbe(params.probe_interval_s)
        self.explorer = NeighbourExplorer(params.explore_interval_s)
        self._last_goodput_tokens_per_s = 0.0

    def choose(self, ctx: StepContext) -> Decision:
        if not ctx.draft_resident or ctx.num_running == 0:
            return Decision(k=0)
        goodputs = [self.predict_goodput(ctx, k) for k in range(self.limit_k + 1)]
        k = best_k(goodputs)
        if k > 0 and goodputs[k] < goodputs[0] * (1.0 + self.params.min_gain):
            k = 0
        self._last_goodput_tokens_per_s = goodputs[k]
        if k > 0:
            self.probe.speculating()
            k = self.explorer.neighbour(ctx.now_s, k, self.limit_k)
        else:
            self.explorer.stopped()
            if self.limit_k > 0 and self.probe.should_probe(ctx.now_s):
                k = min(self.params.probe_k, self.limit_k)
        return Decision(k=k)

    def observe(self, record: StepRecord) -> None:
        # Every step teaches the latency fit; only steps with drafts carry acceptance verdicts.
        self.latency.observe(record)
        if record.num_drafted > 0:
            self.acceptance.observe(record)
            self.probe.verdict()

    def predict_goodput(self, ctx: StepContext, k: int) -> float:
        """Expected emitted tokens per second of the batch's decode work if this step speculates k.

        The prefill chunk is left out of the step time: it runs whatever k is (module docstring)."""
        batch = ctx.num_running
        num_draft_passes = k if k > 0 else int(self.traits.k0_runs_draft_pass)
        step_s = self.latency.predict(
            num_context_tokens=ctx.num_context_tokens,
            num_batched_tokens=batch * (k + 1),
            num_draft_passes=num_draft_passes,
            num_running=batch,
        )
        # A fit with every coefficient clipped to 0 would predict a free step; a floor keeps it finite.
        return batch * self.acceptance.expected_tokens(k) / max(step_s, 1e-9)

    def describe(self) -> dict[str, float]:
        return describe_estimates(self)


def describe_estimates(policy: GoodputPolicy | Policy) -> dict[str, float]:
    """What a goodput-style policy estimates (per-position alpha, latency fit, last prediction, probes), for
    ``describe``; shared with adaptive.py, whose policy keeps the same attributes."""
    alphas = policy.acceptance.alphas()[: max(1, policy.limit_k)]
    out = {f"alpha_{pos}": alpha for pos, alpha in enumerate(alphas)}
    out["mean_alpha"] = policy.acceptance.mean_alpha()
    out.update({f"latency_{name}": value for name, value in policy.latency.coefficients().items()})
    out["predicted_goodput_tokens_per_s"] = policy._last_goodput_tokens_per_s
    out["num_probes"] = float(policy.probe.num_probes)
    out["num_explorations"] = float(policy.explorer.num_explorations)
    return out
