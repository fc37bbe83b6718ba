"""Draft-side signals per drafted token, consistent with the target's verdicts.

The simulated ground truth of acceptance (true_acceptance.py) gives drafted position j of request i the
acceptance probability mu = alpha_i * decay**j (regimes enter through alpha_i).
The generative story per drafted token is:

1. Confidence c ~ Beta(mu * kappa, (1 - mu) * kappa), the draft's probability of the token it drafted,
   centred on mu. It is the token's own acceptance probability, as AdaSpec's Eq. 7 (§4.2) treats it: P_j ~ prod c
   (Figs. 7-8: estimated and actual accepted counts agree). So a confident draft is more likely accepted; the
   token-level correlation of c with the verdict is 1 / sqrt(kappa + 1): 0.45 at kappa = 4, between
   DSDE's token-level entropy r = -0.34 (DSDE §IV-B, Table II, T = 0) and SpecKV's step-level
   r = 0.56 (SpecKV §5.3, Table 2).
2. Verdict: accepted with probability c. Marginally that is probability mu, exactly the old model.
3. Entropy H (nats) of a draft distribution with top-1 mass c and the other 1 - c spread evenly over
   m ~ logU(1, max_alternatives) tokens: H = -c ln c - (1 - c) ln((1 - c) / m) (SpecKV §4.2
   defines H and c over the same softmax; this is speculation/speckv/synthetic.py's shape, in nats, so the
   packaged mlp weights see inputs from their training range). H >= 0, falls as c rises (SpecKV:
   entropy r = -0.55 with acceptance), and m adds the noise.
4. KL(target || draft) = kl_scale * (1 - c)**2 * E, E ~ Exp(1), in nats (DSDE §III-A does not state the
   direction; we take the target as the reference distribution).
   With kl_scale = 2 its mean is Pinsker's bound KL >= 2 TV**2 at TV = 1 - c (speculative sampling accepts
   with probability 1 - TV, Leviathan et al. 2023); greedy verification does not tie KL to acceptance
   that tightly, hence a noisy mean rather than a floor. Higher KL, less likely accepted (DSDE §I). At
   mu = 0.66 the mean is 0.32 nats, inside 0.1-0.5 nats per step, the range of step-mean KLDs in our
   worked example of DSDE's Eqs. 3-8 (tests/unit/test_speculation_kld.py).

Steps 1-2 are sampled in the other order with the same joint law (Beta-Bernoulli conjugacy): the verdict
first, from the replica's acceptance stream exactly as before signals existed, then c from its posterior
Beta(mu * kappa + accepted, (1 - mu) * kappa + rejected) on a separate per-replica stream. Turning
signals on or off therefore changes no verdict, and no policy can perturb the draws.
Cost: one Beta, one uniform and one exponential draw per drafted position, all vectorised per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specserve.sim.config import SignalsConfig

# Keeps Beta shapes positive (alpha 0 or 1 is allowed) and confidences strictly inside (0, 1).
_EPS = 1e-6


@dataclass(frozen=True, slots=True)
class DraftSignals:
    """Per drafting row and planned position, shape (rows, positions); only drafted positions are reported."""

    confidence: np.ndarray  # the draft's probability of its drafted token, in (0, 1)
    entropy_nats: np.ndarray  # the draft distribution's entropy, >= 0
    kl_nats: np.ndarray  # KL(target || draft) at that position, >= 0


class SignalModel:
    def __init__(self, cfg: SignalsConfig) -> None:
        self.concentration = cfg.confidence_concentration
        self.log_max_alternatives = math.log(cfg.max_alternatives)
        self.kl_scale = cfg.kl_scale

    def sample(self, probs: np.ndarray, passed: np.ndarray, rng: np.random.Generator) -> DraftSignals:
        """Signals given each position's acceptance probability and its verdict (arrays of one shape)."""
        # np.minimum(np.maximum()) is np.clip without its Python wrapper; this runs once per simulated step.
        a = np.minimum(np.maximum(probs, _EPS), 1 - _EPS) * self.concentration
        confidence = rng.beta(a + passed, self.concentration - a + ~passed)
        np.maximum(confidence, _EPS, out=confidence)
        np.minimum(confidence, 1 - _EPS, out=confidence)
        rest = 1 - confidence
        log_alternatives = self.log_max_alternatives * rng.random(confidence.shape)
        entropy = rest * (log_alternatives - np.log(rest)) - confidence * np.log(confidence)
        kl = self.kl_scale * rest * rest * rng.standard_exponential(confidence.shape)
        return DraftSignals(confidence, entropy, kl)
