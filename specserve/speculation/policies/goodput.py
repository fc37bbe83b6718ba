"""TurboSpec's ArgMaxGoodput: each step, the k that maximises predicted tokens per second.

TurboSpec §4.1 (goodput, Eq. 1; batch latency, Eqs. 2-3; accepted length, Eq. 4) and §4.2 (Listing 2, with the
k = 0 candidate restored). Predicted goodput for candidate k with B decoding requests:

    goodput(k) = B * l(k) / T_step(k)

where l(k) is the expected tokens per request (Eq. 4, per position) and T_step is the online latency model
(``LINEAR`` features) evaluated with B * (k + 1) decode tokens and k draft passes: one at k = 0 on engines whose
k = 0 still syncs the draft, as vLLM's does (measured on a 2-core CPU with a tiny draft/target pair, a runtime
k = 0 cost 15-25% against an engine without speculation).

The step's prefill chunk is left out of T_step. TurboSpec never speculates in prefill steps (Listing 1); under
chunked prefill (vLLM V1) a chunk rides along with the decodes whatever k is, so its time is not a cost of k.
Charged to the decodes it acts like a huge fixed cost that speculation seems to amortise: with a saturated
8192-token budget (a 7B target on an RTX 4090 at 30 QPS, bench/scenarios/nightjar-4090-7b-sharegpt-30qps.yaml)
every step takes ~1.3 s, k = 4 looks ~2.4x better than k = 0, yet fixed k = 4 has 16% less throughput: its
drafts only displace prefill tokens.

Two guards keep the online fit honest (TurboSpec fits Eq. 3 offline over a grid instead, §4.1.3): a step at a
neighbouring k once per ``explore_interval_s``, and the periodic probe at k = 0. The argmax, both guards and the
acceptance estimate are shared with ``adaptive`` (``parts.goodput_core``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specserve.speculation.estimators.step_latency import StepLatencyModel
from specserve.speculation.policies.parts.goodput_core import GoodputCore, check_ranges, core_checks
from specserve.speculation.policy import Policy, largest_k, register
from specserve.speculation.types import Decision, EngineTraits, StepContext, StepRecord


@dataclass(frozen=True, slots=True)
class GoodputParams:
    # MAX_LEN of Listing 2, the paper's 4; the search is 0..min(max_k, engine max_k) (None: the engine's).
    max_k: int | None = 4
    # Acceptance EWMA half-life in speculative steps. TurboSpec's moving average (§4.1.3) has no stated window;
    # tens of steps follow a drifting workload without chasing one step's noise.
    ema_half_life_steps: float = 20.0
    # Acceptance assumed before any sample (TurboSpec gives no initial value): a cautious cold start.
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
    # max_k; never from k = 0, where the probe runs). Without them a settled k leaves the latency fit blind
    # to the cost of k (``parts.probe.NeighbourExplorer``). At 10-50 ms steps 1 s costs 1-5% of steps at a k
    # next to the best. math.inf ("inf") turns exploration off.
    explore_interval_s: float = 1.0

    def __post_init__(self) -> None:
        check_ranges(self, core_checks(self) | {"latency_half_life_steps": self.latency_half_life_steps > 0})


@register
class GoodputPolicy(Policy):
    """Argmax of predicted goodput over k, with a periodic probe while the argmax is 0 and a periodic step
    at a neighbouring k while it is not."""

    name = "goodput"
    Params = GoodputParams

    def __init__(self, params: GoodputParams, traits: EngineTraits, latency: StepLatencyModel | None = None) -> None:
        super().__init__(params, traits)
        # Largest k searched: the engine's buffers cap what the user asked for.
        self.max_k = largest_k(params.max_k, traits)
        self.core = GoodputCore.from_params(self.max_k, params, traits)
        # Injectable so a profiled fit (profiles are data) can seed the prior; the default is generic. Every
        # observed step re-solves the fit (refit_every=1): its five coefficients are cheap to solve.
        if latency is None:
            latency = StepLatencyModel(half_life_steps=params.latency_half_life_steps)
        self.latency = latency

    def choose(self, ctx: StepContext) -> Decision:
        if not ctx.draft_resident or ctx.num_running == 0:
            return Decision(k=0)
        goodputs = self.core.goodputs(ctx.num_running, self.decode_seconds(ctx))
        return Decision(k=self.core.run(ctx.now_s, self.core.best_k(goodputs), goodputs))

    def seed_acceptance(self, accepted: Sequence[float], reached: Sequence[float]) -> None:
        self.core.acceptance.seed(accepted, reached)

    def observe(self, record: StepRecord) -> None:
        # Every step teaches the latency fit; only steps with drafts carry acceptance verdicts.
        self.latency.observe(record)
        self.core.observe(record)

    def decode_seconds(self, ctx: StepContext) -> list[float]:
        """Predicted seconds of a step of the batch's decodes alone, per k = 0..max_k: the prefill chunk is left
        out, since it runs whatever k is (module docstring)."""
        batch = ctx.num_running
        ks = np.arange(self.max_k + 1)
        passes = np.where(ks > 0, ks, int(self.traits.k0_runs_draft_pass))
        return self.latency.predict_many(ctx.num_context_tokens, batch * (ks + 1), passes, batch).tolist()

    def predict_goodput(self, ctx: StepContext, k: int) -> float:
        """Expected emitted tokens per second of the batch's decode work if this step speculates k."""
        return self.core.goodputs(ctx.num_running, self.decode_seconds(ctx))[k]

    def describe(self) -> dict[str, float]:
        return self.core.describe(self.latency)
