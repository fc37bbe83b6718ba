"""Synthetic draft signals and acceptance, consistent with each other, for SpecKV's default weights.

The packaged weights (``default_weights.json``, ``training.train_synthetic``) are trained on these samples, not
on real logs: they encode only "confident, low-entropy drafts are accepted more", with a made-up slope. Retrain
on the engine's own step logs (``python -m lab train-mlp``) before trusting absolute predictions. The generator:

- a step's regime confidence mu ~ U(0.15, 0.95) (requests differ in how predictable they are);
- per drafted token, confidence c = mu + N(0, 0.1) clipped to [0.02, 0.999], the other 1 - c of the
  draft's mass spread evenly over m = 2^U(0, 8) alternatives, so the entropy in bits is
  H = -c log2 c - (1 - c) log2((1 - c) / m): consistent with c by construction;
- each token is accepted with probability sigmoid(-3 + 7 c - 0.25 H), the first rejection ends the step,
  and the sample's target is accepted / gamma (SpecKV's acceptance rate, §4.3);
- gamma ~ {2, 4, 6, 8} and compression ~ {0, 1, 2} uniformly; compression does not change acceptance
  (SpecKV §5.2: mean acceptance 0.70 / 0.69 / 0.70 across FP16 / INT8 / NF4).
"""

from __future__ import annotations

import math
import random

from specserve.speculation.speckv.model import Sample

# (intercept, per unit of confidence, per bit of entropy) of the per-token acceptance logit.
ACCEPT_LOGIT = (-3.0, 7.0, -0.25)
GAMMAS = (2, 4, 6, 8)


def token_entropy_bits(confidence: float, num_alternatives: float) -> float:
    """Entropy of a distribution with top-1 mass ``confidence`` and the rest spread evenly."""
    rest = 1.0 - confidence
    entropy = -confidence * math.log2(confidence)
    if rest > 0:
        entropy -= rest * math.log2(rest / num_alternatives)
    return entropy


def acceptance_probability(confidence: float, entropy_bits: float) -> float:
    """The generator's per-token acceptance: logistic in confidence and entropy."""
    b0, b_conf, b_entropy = ACCEPT_LOGIT
    return 1.0 / (1.0 + math.exp(-(b0 + b_conf * confidence + b_entropy * entropy_bits)))


def draft_token(rng: random.Random, mean_confidence: float) -> tuple[float, float]:
    """One drafted token's (confidence, entropy in bits) around a regime's mean confidence."""
    confidence = min(0.999, max(0.02, rng.gauss(mean_confidence, 0.1)))
    return confidence, token_entropy_bits(confidence, 2.0 ** rng.uniform(0.0, 8.0))


def synthetic_samples(num_samples: int, seed: int = 0) -> list[Sample]:
    """``num_samples`` (features, acceptance rate) steps, features in ``FEATURE_NAMES`` order."""
    rng = random.Random(seed)
    samples: list[Sample] = []
    for _ in range(num_samples):
        gamma, compression = rng.choice(GAMMAS), rng.randrange(3)
        mean_confidence = rng.uniform(0.15, 0.95)
        tokens = [draft_token(rng, mean_confidence) for _ in range(gamma)]
        accepted = 0
        while accepted < gamma and rng.random() < acceptance_probability(*tokens[accepted]):
            accepted += 1
        confidences, entropies = [c for c, _ in tokens], [h for _, h in tokens]
        features = (
            sum(entropies) / gamma,
            sum(confidences) / gamma,
            max(entropies),
            min(confidences),
            float(compression),
            float(gamma),
        )
        samples.append((features, accepted / gamma))
    return samples
