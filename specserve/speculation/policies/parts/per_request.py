"""``adaptive``'s per-request caps: each running request's own acceptance, and how many drafts each one is worth.

Acceptance differs between requests, and with lookup proposers far more than with a draft model: a copy-heavy edit
accepts nearly every draft, a free-form answer almost none. One batch k drafts both to the same depth, too deep for
the one and too shallow for the other. The engine cuts each request's drafts to a cap before verification
(``Decision.max_k_per_request``; lossless), so the policy can give each request its own depth, the batch k being the
largest (DSDE §III-C gives each sequence its own length the same way, from other evidence).

**A request's own rate** (``RequestAcceptance``). Per running request, the drafts it reached and accepted, pooled
over positions (within one request drafts accept alike: Leviathan et al.'s i.i.d. model behind TurboSpec's Eq. 4),
forgotten at the batch estimate's half-life; a request's evidence goes when it leaves. What that evidence is worth
depends on how much requests differ, which the batch's per-position alphas already say: the requests that reach
position 1 are those that accepted position 0, so alpha_1 = E[a^2] / E[a] over requests and alpha_0 = E[a]. Their
spread v = alpha_0 alpha_1 - alpha_0^2 sets a Beta prior of mean alpha_0 and concentration alpha_0 (1 - alpha_0) / v - 1
(empirical Bayes; Beta is conjugate to the accepted-prefix verdicts), and each request's survival is its posterior
moments. While alpha_1 does not exceed alpha_0 by ``APART_Z`` standard errors the requests accept alike and the
batch's prices hold: a batch whose requests accept alike is priced exactly as one batch k prices it, and so is one
whose requests all have the same evidence. So is a request with no evidence of its own. Caps bias the estimate:
requests capped below position 1 do not report there, so the spread is read from the requests the policy lets draft
deep.

**The drafts each request is worth** (``capped_goodputs``). For a batch cap K, the step's goodput is
``G = sum_r l_r(k_r) / D(sum_r k_r, K)``: l_r the tokens request r yields with k_r drafts, D the decodes' seconds with
that many drafts verified and K draft passes. Request r's j-th draft adds its survival p_rj (the chance drafts 0..j
are all accepted) and costs one verified token's seconds c_K; it raises G exactly when ``p_rj >= G * c_K`` (the
Dinkelbach step for a ratio objective). ``REFINE_STEPS`` such steps per K from the uniform caps, then G at each K is
priced whole with its caps. A K whose caps leave no request at K is not a candidate (a smaller K plans the same
drafts with fewer passes). Work per step is O(B * max_k) in numpy and O(B) in Python (the dictionary look-ups).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

from specserve.speculation.types import StepRecord

# Standard errors by which alpha_1 must exceed alpha_0 before requests are told apart: two keep a uniform batch on
# the batch's prices about 39 steps in 40.
APART_Z = 2.0
# Least Beta concentration: a batch split into accept-all and accept-none requests would give 0, trusting one verdict
# outright.
MIN_PRIOR_SAMPLES = 0.1
# Dinkelbach steps per candidate K: the caps move little after the second.
REFINE_STEPS = 2
# Bounds on the batch rate in the standard error: a batch at 0 or 1 would make every deviation infinitely sure.
_RATE_FLOOR = 0.02


class RequestAcceptance:
    """Decayed (accepted, reached) draft counts per running request."""

    def __init__(self, half_life_steps: float) -> None:
        self._decay = math.pow(0.5, 1.0 / half_life_steps)
        self._counts: dict[str, list[float]] = {}

    def observe(self, record: StepRecord) -> None:
        """Fold in each drafting request's verdicts; a record without aligned ids says nothing per request."""
        ids, drafted = record.request_ids, record.num_drafted_per_request
        if len(ids) != len(drafted):
            return
        decay, counts = self._decay, self._counts
        for rid, d, a in zip(ids, drafted, record.num_accepted_per_request, strict=True):
            if d <= 0:
                continue
            pair = counts.get(rid)
            if pair is None:
                counts[rid] = [float(a), float(min(d, a + 1))]
            else:
                pair[0] = decay * pair[0] + a
                pair[1] = decay * pair[1] + min(d, a + 1)

    def keep_only(self, running: Sequence[str]) -> None:
        """Forget every request not in ``running``: its evidence says nothing about the requests that follow."""
        if self._counts.keys() - set(running):
            keep = set(running)
            self._counts = {rid: c for rid, c in self._counts.items() if rid in keep}

    def tracked(self) -> frozenset[str]:
        """The requests with evidence of their own."""
        return frozenset(self._counts)

    def survival(
        self, request_ids: Sequence[str], batch_alphas: Sequence[float], batch_reached: Sequence[float], max_k: int
    ) -> np.ndarray | None:
        """Per request (rows, aligned with ``request_ids``) and position j < ``max_k``, the chance its drafts 0..j
        are all accepted; None while the batch's alphas say its requests accept alike, or none has evidence."""
        prior = prior_samples(batch_alphas, batch_reached)
        if prior is None or not self._counts or max_k < 1:
            return None
        num_requests, get, empty = len(request_ids), self._counts.get, (0.0, 0.0)
        # Flat, then paired: one pass of C over the pairs instead of a list of lists (this runs every step).
        counts = np.fromiter(chain.from_iterable(get(rid, empty) for rid in request_ids), np.float64, 2 * num_requests)
        counts = counts.reshape(num_requests, 2)
        seen = counts[:, 1] > 0
        every = bool(seen.all())
        if not (every or seen.any()) or (every and (counts == counts[0]).all()):
            return None  # no request has evidence, or all have the same: the batch's alphas know as much
        mean = batch_alphas[0]
        accepted, reached = (counts[:, 0], counts[:, 1]) if every else (counts[seen, 0], counts[seen, 1])
        # Posterior Beta(a, b) per request; E[alpha^(j+1)] = prod_{i<=j} (a + i) / (a + b + i).
        a = prior * mean + accepted
        total = prior + reached
        steps = np.arange(max_k)
        posterior = np.cumprod((a[:, None] + steps) / (total[:, None] + steps), axis=1)
        if every:
            return posterior
        # A request without evidence of its own survives as the batch does.
        survival = np.empty((num_requests, max_k))
        survival[:] = np.cumprod([batch_alphas[min(j, len(batch_alphas) - 1)] for j in range(max_k)])
        survival[seen] = posterior
        return survival


def prior_samples(batch_alphas: Sequence[float], batch_reached: Sequence[float]) -> float | None:
    """The concentration of the Beta prior over requests' alphas that the batch's alpha_0 and alpha_1 imply, or None
    where alpha_1 does not exceed alpha_0 by ``APART_Z`` standard errors (the requests accept alike)."""
    if len(batch_alphas) < 2 or len(batch_reached) < 2:
        return None
    mean, second = batch_alphas[0], batch_alphas[1]
    standard_error = math.sqrt(second * (1.0 - second) / max(batch_reached[1], 1.0))
    if second - mean <= APART_Z * standard_error or not 0.0 < mean < 1.0:
        return None
    spread = mean * second - mean * mean
    return max(mean * (1.0 - mean) / spread - 1.0, MIN_PRIOR_SAMPLES)


# Decode seconds of a step with (verified drafts, draft passes) per candidate, both arrays of one length.
DecodeSeconds = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True, slots=True)
class CappedPlan:
    """Per batch cap K = 0..max_k: the predicted goodput (-inf where K is no candidate) and each request's cap."""

    goodputs: list[float]
    caps: np.ndarray  # (max_k + 1, requests)

    def caps_to_run(self, k: int, run_k: int, request_ids: Sequence[str]) -> tuple[tuple[str, int], ...]:
        """``Decision.max_k_per_request`` for a step whose policy chose ``k`` and runs ``run_k`` (an exploration, a
        probe or a KV cut): a request planned at k runs at run_k, one planned below k keeps its cap up to run_k."""
        caps = self.caps[k]
        if len(caps) != len(request_ids):
            raise ValueError(f"{len(caps)} caps planned for {len(request_ids)} running requests")
        run = np.where(caps >= k, run_k, np.minimum(caps, run_k))
        rows = np.flatnonzero(run < run_k)
        return tuple(zip([request_ids[r] for r in rows.tolist()], run[rows].tolist(), strict=True))


def capped_goodputs(survival: np.ndarray, decode_seconds: DecodeSeconds, min_step_s: float) -> CappedPlan:
    """Each batch cap's goodput when every request drafts only what it is worth (module docstring)."""
    num_requests, max_k = survival.shape
    ks = np.arange(max_k + 1)
    # gained[r, c]: the tokens request r's first c drafts add.
    gained = np.zeros((num_requests, max_k + 1))
    np.cumsum(survival, axis=1, out=gained[:, 1:])
    # One verified token's seconds at K: B more tokens at the uniform width, the passes held.
    both = decode_seconds(num_requests * np.concatenate((ks, np.maximum(ks - 1, 0))), np.concatenate((ks, ks)))
    wide, narrow = both[: max_k + 1], both[max_k + 1 :]
    token_s = np.maximum(wide - narrow, 0.0) / max(num_requests, 1)
    # The uniform caps (every request at K) gain gained's columns whole: no gather needed.
    seconds = np.maximum(decode_seconds(num_requests * ks, ks), min_step_s)
    goodput = (num_requests + gained.sum(axis=0)) / seconds
    rows = np.arange(num_requests)[:, None]
    caps = np.broadcast_to(ks[:, None], (max_k + 1, num_requests))
    for _ in range(REFINE_STEPS):
        worth = (survival[None, :, :] >= (goodput * token_s)[:, None, None]).sum(axis=2)
        caps = np.minimum(worth, ks[:, None])
        goodput = _goodput(gained, rows, caps, decode_seconds, min_step_s)
    goodput[(caps.max(axis=1, initial=0) < ks) & (ks > 0)] = -math.inf
    return CappedPlan(goodput.tolist(), caps)


def _goodput(
    gained: np.ndarray, rows: np.ndarray, caps: np.ndarray, decode_seconds: DecodeSeconds, min_step_s: float
) -> np.ndarray:
    """Per batch cap, the step's goodput with each request at its cap (``rows``: the requests' row indices, as a
    column)."""
    tokens = gained.shape[0] + gained[rows, caps.T].sum(axis=0)
    seconds = np.maximum(decode_seconds(caps.sum(axis=1), caps.max(axis=1, initial=0)), min_step_s)
    return tokens / seconds
