"""Training SpecKV's predictor in pure Python: Adam on squared error plus L2, deterministic for a seed.

SpecKV (§4.3) picks an MLP with 16 hidden units; the authors' released code fits it with scikit-learn's
MLPRegressor(hidden_layer_sizes=(16,)) and its defaults: Glorot-uniform initialisation, Adam (lr 1e-3, beta1
0.9, beta2 0.999, eps 1e-8), L2 alpha 1e-4, mini-batches of min(200, n), shuffled every epoch, loss 1/2 MSE +
alpha / (2 n_batch) * ||W||^2. We follow those, minus sklearn's early-stopping tolerance (a fixed epoch count
keeps runs reproducible), and we standardise the inputs (see ``speckv.model``).

``python -m lab train-mlp`` trains on a samples file (``train_file``; the format is ``speckv.samples``'s). The
packaged ``default_weights.json`` is ``train_synthetic()`` written with ``weights_to_json``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path

from lab.speckv.samples import read_samples
from lab.speckv.synthetic import synthetic_samples
from specserve.speculation.speckv.model import FEATURE_NAMES, MlpWeights, Sample, predict_acceptance

# Settings the packaged default weights were trained with, and the trainer's defaults.
DEFAULT_SEED = 42
DEFAULT_EPOCHS = 100
DEFAULT_LEARNING_RATE = 3e-3
DEFAULT_SYNTHETIC_SAMPLES = 4000


def mean_squared_error(weights: MlpWeights, samples: Sequence[Sample]) -> float:
    """Mean squared error of the clipped prediction, the paper's Table 3 metric."""
    return sum((predict_acceptance(weights, x) - y) ** 2 for x, y in samples) / len(samples)


def _standardisation(samples: Sequence[Sample]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    n, columns = len(samples), len(FEATURE_NAMES)
    means = [sum(x[f] for x, _ in samples) / n for f in range(columns)]
    scales = [math.sqrt(sum((x[f] - means[f]) ** 2 for x, _ in samples) / n) for f in range(columns)]
    # A constant column (e.g. one compression level only) carries no information: scale 1 keeps it finite.
    return tuple(means), tuple(s if s > 1e-12 else 1.0 for s in scales)


class _Adam:
    """Adam state for one flat parameter list."""

    def __init__(self, size: int, learning_rate: float) -> None:
        self.lr, self.m, self.v, self.t = learning_rate, [0.0] * size, [0.0] * size, 0

    def step(self, params: list[float], grads: list[float]) -> None:
        self.t += 1
        b1, b2 = 0.9, 0.999
        correction = math.sqrt(1 - b2**self.t) / (1 - b1**self.t)
        for i, g in enumerate(grads):
            self.m[i] = b1 * self.m[i] + (1 - b1) * g
            self.v[i] = b2 * self.v[i] + (1 - b2) * g * g
            params[i] -= self.lr * correction * self.m[i] / (math.sqrt(self.v[i]) + 1e-8)


def train_mlp(
    samples: Sequence[Sample],
    *,
    hidden: int = 16,
    epochs: int = 50,
    learning_rate: float = 1e-3,
    l2: float = 1e-4,
    batch_size: int = 200,
    seed: int = 42,
    provenance: str = "",
) -> MlpWeights:
    """Fit a 6-``hidden``-1 ReLU MLP to (features, acceptance) samples; the same inputs give the same weights."""
    if not samples:
        raise ValueError("train_mlp needs at least one sample")
    if hidden < 1 or epochs < 1 or batch_size < 1 or not learning_rate > 0 or l2 < 0:
        raise ValueError("hidden, epochs and batch_size must be >= 1, learning_rate > 0 and l2 >= 0")
    n_in = len(FEATURE_NAMES)
    rng = random.Random(seed)
    means, scales = _standardisation(samples)
    data = [([(v - m) / s for v, m, s in zip(x, means, scales, strict=True)], float(y)) for x, y in samples]
    # Flat parameters: hidden weights (hidden * n_in), hidden biases, output weights, output bias.
    bound_in, bound_out = math.sqrt(6.0 / (n_in + hidden)), math.sqrt(6.0 / (hidden + 1))
    params = [rng.uniform(-bound_in, bound_in) for _ in range(hidden * n_in + hidden)]
    params += [rng.uniform(-bound_out, bound_out) for _ in range(hidden + 1)]
    hb, ow, ob = hidden * n_in, hidden * n_in + hidden, hidden * n_in + 2 * hidden
    adam = _Adam(len(params), learning_rate)
    order = list(range(len(data)))
    size = min(batch_size, len(data))
    for _ in range(epochs):
        rng.shuffle(order)
        for start in range(0, len(order), size):
            batch = [data[index] for index in order[start : start + size]]
            adam.step(params, _gradients(params, batch, hidden, l2))
    return MlpWeights(
        input_mean=means,
        input_scale=scales,
        hidden_weights=tuple(tuple(params[j * n_in : (j + 1) * n_in]) for j in range(hidden)),
        hidden_bias=tuple(params[hb:ow]),
        output_weights=tuple(params[ow:ob]),
        output_bias=params[ob],
        provenance=provenance,
    )


def _gradients(params: list[float], batch: list[tuple[list[float], float]], hidden: int, l2: float) -> list[float]:
    """Gradient of the batch's loss over the flat parameters (hidden weights, hidden biases, output weights,
    output bias), by backpropagation through the one ReLU layer."""
    n_in = len(FEATURE_NAMES)
    hb, ow, ob = hidden * n_in, hidden * n_in + hidden, hidden * n_in + 2 * hidden
    grads = [0.0] * len(params)
    for z, y in batch:
        pre = [params[hb + j] + sum(params[j * n_in + f] * z[f] for f in range(n_in)) for j in range(hidden)]
        out = params[ob] + sum(params[ow + j] * p for j, p in enumerate(pre) if p > 0.0)
        d_out = (out - y) / len(batch)
        grads[ob] += d_out
        for j, p in enumerate(pre):
            if p > 0.0:
                grads[ow + j] += d_out * p
                d_hidden = d_out * params[ow + j]
                grads[hb + j] += d_hidden
                for f in range(n_in):
                    grads[j * n_in + f] += d_hidden * z[f]
    for i in list(range(hb)) + list(range(ow, ob)):  # L2 on weights, not biases (sklearn)
        grads[i] += l2 * params[i] / len(batch)
    return grads


def train_file(
    path: Path, *, epochs: int = DEFAULT_EPOCHS, learning_rate: float = DEFAULT_LEARNING_RATE, seed: int = DEFAULT_SEED
) -> tuple[MlpWeights, list[Sample]]:
    """Weights trained on a samples file, and the samples; a bad line or an empty file raises ValueError."""
    samples = read_samples(path)
    if not samples:
        raise ValueError("the file holds no samples")
    provenance = f"trained on {path.name} ({len(samples)} samples), epochs={epochs}"
    weights = train_mlp(samples, epochs=epochs, learning_rate=learning_rate, seed=seed, provenance=provenance)
    return weights, samples


def train_synthetic(
    num_samples: int = DEFAULT_SYNTHETIC_SAMPLES,
    *,
    epochs: int = DEFAULT_EPOCHS,
    learning_rate: float = DEFAULT_LEARNING_RATE,
    seed: int = DEFAULT_SEED,
) -> MlpWeights:
    """Weights trained on ``speckv.synthetic`` samples; with the defaults, the packaged default weights."""
    samples = synthetic_samples(num_samples, seed=seed)
    provenance = (
        f"synthetic: speckv.synthetic.synthetic_samples({num_samples}, seed={seed}), epochs={epochs}, "
        f"learning_rate={learning_rate}; not trained on real logs"
    )
    return train_mlp(samples, epochs=epochs, learning_rate=learning_rate, seed=seed, provenance=provenance)
