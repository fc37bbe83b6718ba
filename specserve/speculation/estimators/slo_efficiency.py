"""AdaSpec's SLO-aware efficiency estimator (§5.3, Algorithm 3) over its acceptance model (§4.2, Eqs. 6-7).

For per-request draft lengths k_i the estimator is

    N = b + sum_i sum_{j <= k_i} P_{i,j}          P_{i,j} = prod_{m <= j} c_{i,m}   (Eqs. 6-7)
    f = N / T   or  -1 when some k_i > 0 and T > S (the TPOT SLO; a plain k = 0 step is exempt)

T is the step time predicted for ``num_draft_passes`` draft passes and sum_i (k_i + 1) verified tokens: a
request that gets only its bonus token waits the whole step for it, so T itself is its TPOT (§5.3). The searches
built on f are the policy's (``policies.parts.slo_search``).
"""

from __future__ import annotations

from collections.abc import Callable

# Step seconds for (draft passes, tokens the target verifies); the policy binds context and batch.
StepSeconds = Callable[[int, int], float]
# Efficiency the SLO guard assigns to a configuration whose step would exceed the SLO (§5.3).
SLO_VIOLATION = -1.0


def batch_expansion_context(num_context_tokens: float, num_requests: float, k: float) -> float:
    """Tokens the target reads when batch expansion scores k drafts per request (§4.1, Eq. 4, as the authors'
    released code computes it): position j of each request is its own sequence with j more tokens,
    ``(k + 1) C + b k (k + 1) / 2``."""
    return (k + 1) * num_context_tokens + num_requests * k * (k + 1) / 2


def slo_efficiency(num_emitted: float, step_s: float, slo_tpot_s: float | None, speculating: bool) -> float:
    """Algorithm 3's return value: tokens per second, or -1 if a speculative step would break the SLO."""
    if speculating and slo_tpot_s is not None and step_s > slo_tpot_s:
        return SLO_VIOLATION
    return num_emitted / max(step_s, 1e-9)


def uniform_efficiencies(
    num_running: int, confidence: float, max_k: int, step_seconds: StepSeconds, slo_tpot_s: float | None
) -> list[float]:
    """f(k) for k = 0..max_k when every request's every draft is predicted at ``confidence`` (c-bar)."""
    out, emitted, survive = [], float(num_running), 1.0
    for k in range(max_k + 1):
        if k > 0:
            survive *= confidence
            emitted += num_running * survive
        step_s = step_seconds(k, num_running * (k + 1))
        out.append(slo_efficiency(emitted, step_s, slo_tpot_s, speculating=k > 0))
    return out
