"""SpecKV's acceptance predictor: a 6-16-1 ReLU MLP in pure Python, its features and its JSON weights file.

SpecKV §4.2 (the four draft signals), §4.1 (compression levels, here an ordinal code) and §4.3 (an MLP with 16
hidden units; as in the authors' released code, one ReLU layer, an identity output, the prediction clipped to
[0, 1]). The six inputs, in the paper's order:

    mean_draft_entropy, mean_draft_confidence, max_draft_entropy, min_draft_confidence, compression, gamma

Entropies are in bits (the paper's log2); ``StepRecord`` carries nats, converted here. The paper feeds raw
features; we standardise each input with a mean and scale stored beside the weights (an affine map the
first layer could absorb), because it lets pure-Python SGD converge in tens of epochs instead of hundreds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

FEATURE_NAMES = (
    "mean_draft_entropy",
    "mean_draft_confidence",
    "max_draft_entropy",
    "min_draft_confidence",
    "compression",
    "gamma",
)
# The target's weight quantization, coded as in the authors' released code: an ordinal, not one-hot.
COMPRESSION_CODES = {"fp16": 0, "int8": 1, "nf4": 2}
WEIGHTS_FORMAT = "specserve-mlp-acceptance/1"
DEFAULT_WEIGHTS_FILE = "default_weights.json"
# One training example: the six features in FEATURE_NAMES order and the step's acceptance rate in [0, 1].
Sample = tuple[Sequence[float], float]
_LN2 = math.log(2.0)


@dataclass(frozen=True, slots=True)
class MlpWeights:
    """A trained predictor: input standardisation, one ReLU hidden layer, a linear output."""

    input_mean: tuple[float, ...]  # per feature, subtracted first
    input_scale: tuple[float, ...]  # per feature, divided by next (never 0)
    hidden_weights: tuple[tuple[float, ...], ...]  # [hidden][feature]
    hidden_bias: tuple[float, ...]  # [hidden]
    output_weights: tuple[float, ...]  # [hidden]
    output_bias: float
    # Where the weights came from, e.g. "synthetic: ..." or a training log's path; shown to operators.
    provenance: str = ""

    def __post_init__(self) -> None:
        n = len(FEATURE_NAMES)
        if len(self.input_mean) != n or len(self.input_scale) != n:
            raise ValueError(f"input_mean and input_scale need {n} values")
        if any(not s > 0 for s in self.input_scale):
            raise ValueError("input_scale values must be positive")
        if not self.hidden_weights or any(len(row) != n for row in self.hidden_weights):
            raise ValueError(f"hidden_weights must be rows of {n} values")
        if len(self.hidden_bias) != len(self.hidden_weights) or len(self.output_weights) != len(self.hidden_weights):
            raise ValueError("hidden_bias and output_weights need one value per hidden unit")


def predict_raw(weights: MlpWeights, features: Sequence[float]) -> float:
    """The network's output before clipping (what training fits)."""
    z = [(x - m) / s for x, m, s in zip(features, weights.input_mean, weights.input_scale, strict=True)]
    out = weights.output_bias
    for row, bias, w_out in zip(weights.hidden_weights, weights.hidden_bias, weights.output_weights, strict=True):
        h = bias + sum(w * x for w, x in zip(row, z, strict=True))
        if h > 0.0:
            out += w_out * h
    return out


def predict_acceptance(weights: MlpWeights, features: Sequence[float]) -> float:
    """Predicted step acceptance rate a = accepted / gamma, clipped to [0, 1] (SpecKV Eq. 1's a-hat)."""
    return min(1.0, max(0.0, predict_raw(weights, features)))


def step_features(confidences: Sequence[float], entropies_nats: Sequence[float]) -> tuple[float, float, float, float]:
    """The four draft signals of one request's step (SpecKV §4.2), entropies converted to bits."""
    bits = [h / _LN2 for h in entropies_nats]
    return (sum(bits) / len(bits), sum(confidences) / len(confidences), max(bits), min(confidences))


def weights_to_json(weights: MlpWeights) -> str:
    return (
        json.dumps(
            {
                "format": WEIGHTS_FORMAT,
                "feature_names": list(FEATURE_NAMES),
                "provenance": weights.provenance,
                "input_mean": list(weights.input_mean),
                "input_scale": list(weights.input_scale),
                "hidden_weights": [list(row) for row in weights.hidden_weights],
                "hidden_bias": list(weights.hidden_bias),
                "output_weights": list(weights.output_weights),
                "output_bias": weights.output_bias,
            },
            indent=1,
        )
        + "\n"
    )


def weights_from_json(text: str) -> MlpWeights:
    """Parse a weights file; errors say what is wrong rather than raising KeyError deep inside."""
    data = json.loads(text)
    if data.get("format") != WEIGHTS_FORMAT:
        raise ValueError(f"weights format {data.get('format')!r} is not {WEIGHTS_FORMAT!r}")
    if tuple(data.get("feature_names", ())) != FEATURE_NAMES:
        raise ValueError(f"weights feature_names must be {list(FEATURE_NAMES)}")
    return MlpWeights(
        input_mean=tuple(float(v) for v in data["input_mean"]),
        input_scale=tuple(float(v) for v in data["input_scale"]),
        hidden_weights=tuple(tuple(float(v) for v in row) for row in data["hidden_weights"]),
        hidden_bias=tuple(float(v) for v in data["hidden_bias"]),
        output_weights=tuple(float(v) for v in data["output_weights"]),
        output_bias=float(data["output_bias"]),
        provenance=str(data.get("provenance", "")),
    )


def load_weights(path: str = "") -> MlpWeights:
    """Weights from ``path``, or the packaged synthetic defaults when it is empty.

    A missing, unreadable or malformed file raises ValueError naming the path, so ``mlp:weights=...`` fails
    like any other bad policy parameter (one line, not a traceback from deep inside the parser).
    """
    if path:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ValueError(f"weights={path!r}: cannot read it ({exc.strerror or exc})") from None
        try:
            return weights_from_json(text)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise ValueError(f"weights={path!r} is not an mlp weights file ({detail})") from None
    return weights_from_json(resources.files("specserve.speculation.speckv").joinpath(DEFAULT_WEIGHTS_FILE).read_text())
