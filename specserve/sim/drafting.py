"""One step's drafting: verdicts, draft-side signals, and the policy's early stop, for the drafting rows.

The scheduler has already granted each drafting row its planned drafts: the batch k, lowered by the
request's cap from ``Decision.max_k_per_request`` or by the token budget. Then, all drawn at step start:

1. verdicts for every planned position, from the replica's acceptance stream (true_acceptance.py);
2. signals given those verdicts, from the replica's signal stream (signals.py), unless turned off;
3. the draft loop: after pass j (0-based) the step's ``Decision.draft_stop.after_pass(j, c_j)`` is asked, with
   c_j the mean confidence over the requests that drafted at j (the DraftStop contract: one call per pass with
   the batch mean). True keeps the drafts so far and runs no further pass for any request. It is only asked
   when the decision carries a rule, and only with signals on (no confidence, no early stop).

Cost model (latency.StepTimer): a draft pass is one batched forward; the step runs max_i d_i passes, d_i
the drafts request i proposed after its cap and any early stop, and pass j >= 2 carries one token per
request still drafting. A request that stopped early waits for the batch's last pass (the straggler effect
DSDE's cap targets, DSDE §III-C); the target verifies only the drafts made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from specserve.sim.signals import DraftSignals, SignalModel
from specserve.sim.true_acceptance import TrueAcceptance, accepted_prefix

# DraftStop.after_pass(position, confidence) -> stop now?
StopHook = Callable[[int, float], bool]


@dataclass(frozen=True, slots=True)
class Drafts:
    """What the drafting rows of one step proposed and the target accepted, aligned with those rows."""

    drafted: np.ndarray  # drafts proposed per row, 1..planned (early stop shortens it)
    accepted: np.ndarray  # accepted prefix per row, 0..drafted
    signals: DraftSignals | None  # (rows, planned.max()) arrays; only columns < drafted are real
    # The policy stopped the draft loop before some row's planned drafts: the target verifies fewer.
    stopped_early: bool = False
    # The fewest drafts any row proposed, and the most (the step's draft passes); 0, 0: not given, read off drafted.
    fewest: int = 0
    most: int = 0

    def __post_init__(self) -> None:
        if not self.most and len(self.drafted):
            object.__setattr__(self, "fewest", int(self.drafted.min()))
            object.__setattr__(self, "most", int(self.drafted.max()))


class Drafter:
    def __init__(
        self,
        acceptance: TrueAcceptance,
        signals: SignalModel | None,
        verdict_rng: np.random.Generator,
        signal_rng: np.random.Generator,
    ) -> None:
        self.acceptance = acceptance
        self.signals = signals
        self.verdict_rng = verdict_rng
        self.signal_rng = signal_rng

    def draft(self, alphas: np.ndarray, planned: np.ndarray, stop: StopHook | None = None) -> Drafts:
        """Draft for rows with ``planned`` >= 1 drafts each (aligned with ``alphas``); ``stop`` is the step's
        draft-loop rule (``Decision.draft_stop``), asked only when signals give it confidences."""
        width, fewest = int(planned.max()), int(planned.min())
        # Every row drafts every position (the common step): no row's verdicts or means need a mask.
        uniform = fewest == width
        probs = self.acceptance.position_probs(alphas, width)
        passed = self.acceptance.sample_passed(probs, planned, self.verdict_rng, uniform)
        signals = None if self.signals is None else self.signals.sample(probs, passed, self.signal_rng)
        if stop is None or signals is None:
            num_passes = passed.shape[1]
        else:
            num_passes = self._num_passes(planned, signals.confidence, stop, uniform)
        if num_passes == width:
            return Drafts(planned, accepted_prefix(passed), signals, False, fewest, width)
        passed = passed[:, :num_passes]
        drafted = np.minimum(planned, num_passes)
        return Drafts(drafted, accepted_prefix(passed), signals, True, min(fewest, num_passes), num_passes)

    def _num_passes(self, planned: np.ndarray, confidence: np.ndarray, stop: StopHook, uniform: bool) -> int:
        """Ask the policy after every pass run; the first True ends the loop after that pass."""
        if uniform:
            # The same sums without the mask.
            means = (np.add.reduce(confidence, axis=0) / len(planned)).tolist()
        else:
            drafting = np.arange(confidence.shape[1]) < planned[:, None]
            means = ((confidence * drafting).sum(axis=0) / drafting.sum(axis=0)).tolist()
        for position, mean in enumerate(means):
            if stop(position, mean):
                return position + 1
        return len(means)


def ragged(values: np.ndarray, lengths: np.ndarray, uniform: bool) -> tuple[tuple[float, ...], ...]:
    """Row i's first lengths[i] values as the nested tuples StepRecord carries; ``uniform``: all equal."""
    if uniform:
        return tuple(map(tuple, values[:, : int(lengths[0])].tolist()))
    return tuple(tuple(row[:n]) for row, n in zip(values.tolist(), lengths.tolist(), strict=True))
