"""AdaSpec's SLO-aware efficiency estimator and the two searches built on it.

research/adaspec.md §2.4 (Eqs. 6-7), §2.5 (Theorem 4.3: f(k) is quasi-concave, so the search stops at the
first peak), §2.6 (Algorithm 3, the estimator with the SLO guard), §2.7 (Algorithm 1's predict step) and
§2.8 (Algorithm 2, draft-token elimination). The estimator for per-request draft lengths k_i is

    N = b + sum_i sum_{j <= k_i} P_{i,j}          P_{i,j} = prod_{m <= j} c_{i,m}   (Eqs. 6-7)
    f = N / T   or  -1 when some k_i > 0 and T > S (the TPOT SLO; a plain k = 0 step is exempt)

T is the step time predicted for ``num_draft_passes`` draft passes and sum_i (k_i + 1) verified tokens: a
request that gets only its bonus token waits the whole step for it, so T itself is its TPOT (§2.6).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

# Step seconds for (draft passes, tokens the target verifies); the policy binds context and batch.
StepSeconds = Callable[[int, int], float]
# Efficiency the SLO guard assigns to a configuration whose step would exceed the SLO (§2.6).
SLO_VIOLATION = -1.0


def batch_expansion_context(num_context_tokens: float, num_requests: float, k: float) -> float:
    """Tokens the target reads when batch expansion scores k drafts per request (Eq. 4, the authors' code):
    position j of each request is its own sequence with j more tokens, ``(k + 1) C + b k (k + 1) / 2``."""
    return (k + 1) * num_context_tokens + num_requests * k * (k + 1) / 2


def slo_efficiency(num_emitted: float, step_s: float, slo_tpot_s: float | None, speculating: bool) -> float:
    """Algorithm 3's return value: tokens per second, or -1 if a speculative step would break the SLO."""
    if speculating and slo_tpot_s is not None and step_s > slo_tpot_s:
        return SLO_VIOLATION
    return num_emitted / max(step_s, 1e-9)


def uniform_efficiencies(
    num_running: int, confidence: float, limit_k: int, step_seconds: StepSeconds, slo_tpot_s: float | None
) -> list[float]:
    """f(k) for k = 0..limit_k when every request's every draft is predicted at ``confidence`` (c-bar)."""
    out, emitted, survive = [], float(num_running), 1.0
    for k in range(limit_k + 1):
        if k > 0:
            survive *= confidence
            emitted += num_running * survive
        step_s = step_seconds(k, num_running * (k + 1))
        out.append(slo_efficiency(emitted, step_s, slo_tpot_s, speculating=k > 0))
    return out


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


def eliminate_drafts(
    confidences: Sequence[float], k: int, step_seconds: StepSeconds
) -> tuple[list[int], float]:
    """Algorithm 2: drop the least likely draft while that raises f; returns (k_i per request, final f).

    Request i's drafts are predicted at its own confidence c_i, so P_{i,j} = c_i^j falls with j and the
    globally least likely draft is always some request's last kept one: kept drafts stay prefixes. No SLO
    check is needed: removing drafts only shortens the step (§2.6). Each trial is O(log b) with a heap.
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
