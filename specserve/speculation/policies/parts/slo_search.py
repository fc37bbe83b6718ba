"""AdaSpec's searches over its efficiency estimator f (``estimators.slo_efficiency``).

- ``first_peak``: Algorithm 1's predict step (§5.1), k from f(0..K) predicted at the mean confidence; by
  Theorem 4.3 (§4.3) f is quasi-concave in k, so the first peak is the global one.
- ``SloDraftStop``: Algorithm 1's execute-correct half, a ``DraftStop`` for one step's draft loop.
- ``eliminate_drafts``: Algorithm 2 (§5.2), per-request trimming of the least likely drafts.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from specserve.speculation.estimators.slo_efficiency import StepSeconds, slo_efficiency


def first_peak(efficiencies: Sequence[float]) -> int:
    """Algorithm 1 over predicted f(0..K): speculate only if f(1) > f(0), then go on while f does not drop.

    The pre-check is strict (a tie means no speculation); later passes continue on ties and stop at the
    first drop, which by Theorem 4.3 is the global peak. An SLO violation (-1) is always a drop.
    """
    if len(efficiencies) < 2 or not efficiencies[1] > efficiencies[0]:
        return 0
    best = 1
    for k in range(2, len(efficiencies)):
        if efficiencies[k] < efficiencies[best]:
            break
        best = k
    return best


@dataclass(slots=True, eq=False)  # a rule is one step's object: compared and hashed by identity
class SloDraftStop:
    """Algorithm 1's predict-execute-correct for one step's draft loop (a ``DraftStop``).

    Asked once per pass, in order, with the batch-mean confidence of the pass just run. Correct: if f with the
    real confidence fell below the previous pass's f, stop (the pass's drafts are kept, as the authors' code
    does) and remember the pass in ``dropped_position``. Predict: stop if one more pass at c-bar would lower f,
    or once ``max_passes`` ran.
    """

    num_running: int
    max_passes: int
    step_seconds: StepSeconds
    slo_tpot_s: float | None
    mean_confidence: float  # c-bar when the step was chosen: the prediction for passes not yet run
    best: float  # f of the last kept pass; f(0) before any pass
    emitted: float  # predicted emitted tokens over the batch so far (b bonus tokens + drafts)
    survive: float = 1.0  # P_j: product of the batch-mean confidences of the passes so far
    passes: int = 0
    # The pass at which f dropped; the policy keeps its confidences out of c-bar, as the authors' code does.
    dropped_position: int | None = None

    def after_pass(self, position: int, confidence: float) -> bool:
        self.passes = position + 1
        self.survive *= confidence
        self.emitted += self.num_running * self.survive
        actual = self.efficiency(self.emitted, self.passes)
        if actual < self.best:
            self.dropped_position = position
            self.best = actual
            return True
        self.best = actual
        if self.passes >= self.max_passes:
            return True
        next_emitted = self.emitted + self.num_running * self.survive * self.mean_confidence
        return self.efficiency(next_emitted, self.passes + 1) < self.best

    def efficiency(self, emitted: float, passes: int) -> float:
        step_s = self.step_seconds(passes, self.num_running * (passes + 1))
        return slo_efficiency(emitted, step_s, self.slo_tpot_s, speculating=passes > 0)

    def break_even_confidence(self) -> float:
        """The confidence below which the next pass's correction finds f dropped (the stop threshold)."""
        passes = self.passes + 1
        step_s = self.step_seconds(passes, self.num_running * (passes + 1))
        return (self.best * step_s - self.emitted) / (self.num_running * self.survive)


def eliminate_drafts(confidences: Sequence[float], k: int, step_seconds: StepSeconds) -> tuple[list[int], float]:
    """Algorithm 2: drop the least likely draft while that raises f; returns (k_i per request, final f).

    Request i's drafts are predicted at its own confidence c_i, so P_{i,j} = c_i^j falls with j and the
    globally least likely draft is always some request's last kept one: kept drafts stay prefixes. No SLO
    check is needed: removing drafts only shortens the step (§5.3). Each trial is O(log b) with a heap.
    """
    lengths = [k] * len(confidences)
    emitted = float(len(confidences)) + sum(sum(c**j for j in range(1, k + 1)) for c in confidences)
    num_verified = len(confidences) * (k + 1)
    current = emitted / max(step_seconds(k, num_verified), 1e-9)
    heap = [(c**k, i) for i, c in enumerate(confidences) if k > 0]
    heapq.heapify(heap)
    while heap:
        prob, i = heap[0]
        trial = (emitted - prob) / max(step_seconds(k, num_verified - 1), 1e-9)
        if not trial > current:
            break
        heapq.heappop(heap)
        emitted, num_verified, current = emitted - prob, num_verified - 1, trial
        lengths[i] -= 1
        if lengths[i] > 0:
            heapq.heappush(heap, (confidences[i] ** lengths[i], i))
    return lengths, current
