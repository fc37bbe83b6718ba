"""What ``goodput`` and ``adaptive`` share: TurboSpec's goodput argmax over k, and the two ways out of a settled k.

Each step the policy prices the decodes' seconds D(k) for k = 0..max_k its own way (``goodput``: the step with
the decode tokens only; ``adaptive``: at the margin of the prefill chunk, corrected per batch bucket). The core
turns them into predicted goodput, B * l(k) / D(k) with l(k) the expected tokens per request from the
per-position acceptance estimate (TurboSpec Eq. 4), takes the argmax with ties to the smaller k (Listing 2's
strict ``>``), and speculates only if the best k > 0 adds ``min_gain`` over k = 0. It then runs the chosen k,
except for an occasional step at a neighbouring k while speculating (``NeighbourExplorer``) and an occasional
probe while at k = 0 (``ZeroProbe``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from specserve.speculation.estimators.acceptance import PositionAcceptance
from specserve.speculation.estimators.step_latency import StepLatencyModel
from specserve.speculation.policies.parts.probe import NeighbourExplorer, ZeroProbe, up_steps_for
from specserve.speculation.policies.parts.ties import argmax_smallest
from specserve.speculation.types import EngineTraits, StepRecord

# Seconds below which a predicted step counts as this long: a fit with every coefficient clipped to 0 would
# predict a free step, and goodput must stay finite.
MIN_STEP_S = 1e-9


class CoreParams(Protocol):
    """The parameters ``GoodputCore`` reads, named alike in every policy built on it."""

    @property
    def max_k(self) -> int | None: ...
    @property
    def ema_half_life_steps(self) -> float: ...
    @property
    def prior_alpha(self) -> float: ...
    @property
    def probe_interval_s(self) -> float: ...
    @property
    def probe_k(self) -> int: ...
    @property
    def min_gain(self) -> float: ...
    @property
    def explore_interval_s(self) -> float: ...


def check_ranges(params: object, checks: dict[str, bool]) -> None:
    """Raise ValueError naming the first parameter whose range check (name -> in range) failed: a Params class's
    ``__post_init__`` lists its checks once instead of an ``if``/``raise`` per field."""
    for name, ok in checks.items():
        if not ok:
            raise ValueError(f"{name}={getattr(params, name)} is out of range")


def core_checks(params: CoreParams) -> dict[str, bool]:
    """Per parameter ``GoodputCore`` reads, whether its value is in range (for ``check_ranges``)."""
    return {
        "max_k": params.max_k is None or params.max_k >= 0,
        "ema_half_life_steps": params.ema_half_life_steps > 0,
        "prior_alpha": 0.0 <= params.prior_alpha <= 1.0,
        "probe_interval_s": params.probe_interval_s > 0,
        "probe_k": params.probe_k >= 1,
        "min_gain": 0.0 <= params.min_gain < 1.0,
        "explore_interval_s": params.explore_interval_s > 0,
    }


class GoodputCore:
    """The acceptance estimate, the argmax of predicted goodput, the probe at k = 0 and neighbour exploration."""

    def __init__(
        self,
        max_k: int,
        *,
        ema_half_life_steps: float,
        prior_alpha: float,
        probe_interval_s: float,
        probe_k: int,
        min_gain: float,
        explore_interval_s: float,
        explore_up_steps: int = 1,
        probe_on_turnover: bool = False,
        max_turnovers: int = 1,
    ) -> None:
        # The largest k searched: the policy's max_k capped by the engine's.
        self.max_k = max_k
        self.acceptance = PositionAcceptance(
            max_k=max(1, max_k), half_life_steps=ema_half_life_steps, prior_alpha=prior_alpha
        )
        self.probe = ZeroProbe(probe_interval_s, on_turnover=probe_on_turnover, max_turnovers=max_turnovers)
        self.explorer = NeighbourExplorer(explore_interval_s, up_steps=explore_up_steps)
        self.probe_k = probe_k
        self.min_gain = min_gain
        # Predicted goodput of the k the policy chose last (before exploration or probing), for ``describe``.
        self.last_goodput_tokens_per_s = 0.0

    @classmethod
    def from_params(
        cls,
        max_k: int,
        params: CoreParams,
        traits: EngineTraits,
        *,
        probe_on_turnover: bool = False,
        max_turnovers: int = 1,
    ) -> GoodputCore:
        """The core a policy's parameters describe, searching 0..``max_k`` (the policy's cap after the engine's).
        An upward exploration lasts as long as the engine needs to verify a draft at its new depth."""
        return cls(
            max_k,
            ema_half_life_steps=params.ema_half_life_steps,
            prior_alpha=params.prior_alpha,
            probe_interval_s=params.probe_interval_s,
            probe_k=params.probe_k,
            min_gain=params.min_gain,
            explore_interval_s=params.explore_interval_s,
            explore_up_steps=up_steps_for(traits.drafts_ahead),
            probe_on_turnover=probe_on_turnover,
            max_turnovers=max_turnovers,
        )

    def goodputs(self, num_running: int, decode_seconds: Sequence[float]) -> list[float]:
        """Predicted tokens per second of the decodes for k = 0..max_k, from their seconds per k."""
        tokens = self.acceptance.expected_tokens_upto(self.max_k)
        return [num_running * n / max(s, MIN_STEP_S) for n, s in zip(tokens, decode_seconds, strict=True)]

    def best_k(self, goodputs: Sequence[float]) -> int:
        """The argmax, ties to the smaller k, or 0 if the best k > 0 adds less than ``min_gain`` over k = 0.

        Where k = 1 costs about what k = 0 costs (vLLM's k = 0 still runs a draft pass), the acceptance prior
        alone would otherwise keep a useless draft speculating.
        """
        k = argmax_smallest(goodputs)
        if k > 0 and goodputs[k] < goodputs[0] * (1.0 + self.min_gain):
            return 0
        return k

    def run(self, now_s: float, k: int, goodputs: Sequence[float], request_ids: tuple[str, ...] = ()) -> int:
        """The k to run this step when the policy chose ``k``: now and then a neighbour of a k > 0, and now and
        then ``probe_k`` instead of 0, so neither the latency fit nor the acceptance estimate can freeze."""
        self.last_goodput_tokens_per_s = goodputs[k]
        if k > 0:
            self.probe.speculating(request_ids)
            return self.explorer.neighbour(now_s, k, self.max_k)
        self.explorer.stopped()
        turnovers = self.probe.num_turnover_probes
        if self.max_k > 0 and self.probe.should_probe(now_s, request_ids):
            if self.probe.num_turnover_probes > turnovers:
                # The estimate that stopped speculation came from requests that have left: the probe's verdicts,
                # about the requests now running, must be able to outweigh it (one verdict at a 20-step half-life
                # moves it by about 3 %).
                self.acceptance.forget(self.acceptance.prior_weight)
            return min(self.probe_k, self.max_k)
        return 0

    def observe(self, record: StepRecord) -> None:
        """Only steps with drafts carry acceptance verdicts; they also end a running probe."""
        if record.num_drafted > 0:
            self.acceptance.observe(record)
            self.probe.verdict()

    def describe(self, latency: StepLatencyModel) -> dict[str, float]:
        """Per-position alpha, the latency fit, the last prediction, probes and explorations."""
        alphas = self.acceptance.alphas()[: max(1, self.max_k)]
        out = {f"alpha_{pos}": alpha for pos, alpha in enumerate(alphas)}
        out["mean_alpha"] = self.acceptance.mean_alpha()
        out.update({f"latency_{name}": value for name, value in latency.coefficients().items()})
        out["predicted_goodput_tokens_per_s"] = self.last_goodput_tokens_per_s
        out["num_probes"] = float(self.probe.num_probes)
        out["num_turnover_probes"] = float(self.probe.num_turnover_probes)
        out["num_explorations"] = float(self.explorer.num_explorations)
        return out
