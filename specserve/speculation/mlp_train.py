"""Train SpecKV's acceptance predictor from a JSONL file of step samples and write the weights JSON.

The samples' format is ``mlp_samples``'s (one speculative step of one request per line).
``specserve sim train-mlp`` runs the same ``train_file``.

    python -m specserve.speculation.mlp_train samples.jsonl --out weights.json
    python -m specserve.speculation.mlp_train --synthetic 4000 --out specserve/speculation/mlp_default_weights.json

The second line regenerates the packaged defaults (synthetic, see ``mlp_synthetic``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from specserve.speculation.speckv.training import Sample, mean_squared_error, train_mlp
from specserve.speculation.speckv.model import MlpWeights, weights_to_json
from specserve.speculation.speckv.samples import read_samples
from specserve.speculation.speckv.synthetic import synthetic_samples

# Settings the packaged default weights were trained with.
DEFAULT_SYNTHETIC_SEED = 42
DEFAULT_EPOCHS = 100
DEFAULT_LEARNING_RATE = 3e-3


def train_file(
    path: Path, *, epochs: int = DEFAULT_EPOCHS, learning_rate: float = DEFAULT_LEARNING_RATE,
    seed: int = DEFAULT_SYNTHETIC_SEED,
) -> tuple[MlpWeights, list[Sample]]:
    """Weights trained on a samples file, and the samples; a bad line or an empty file raises ValueError."""
    samples = read_samples(path)
    if not samples:
        raise ValueError("the file holds no samples")
    provenance = f"trained on {path.name} ({len(samples)} samples), epochs={epochs}"
    weights = train_mlp(samples, epochs=epochs, learning_rate=learning_rate, seed=seed, provenance=provenance)
    return weights, samples


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mlp_train", description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("samples", nargs="?", type=Path, help="JSONL file of step samples")
    source.add_argument("--synthetic", type=int, metavar="N", help="train on N synthetic samples instead")
    parser.add_argument("--out", type=Path, required=True, help="weights JSON to write")
    parser.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS)
    parser.add_argument("--learning-rate", type=float, default=DEFAULT_LEARNING_RATE)
    parser.add_argument("--seed", type=int, default=DEFAULT_SYNTHETIC_SEED)
    args = parser.parse_args(argv)
    if args.synthetic is not None:
        samples = synthetic_samples(args.synthetic, seed=args.seed)
        provenance = (f"synthetic: mlp_synthetic.synthetic_samples({args.synthetic}, seed={args.seed}), "
                      f"epochs={args.epochs}, learning_rate={args.learning_rate}; not trained on real logs")
        weights = train_mlp(samples, epochs=args.epochs, learning_rate=args.learning_rate, seed=args.seed,
                            provenance=provenance)
    else:
        weights, samples = train_file(args.samples, epochs=args.epochs, learning_rate=args.learning_rate,
                                      seed=args.seed)
    args.out.write_text(weights_to_json(weights))
    print(f"wrote {args.out}: {len(samples)} samples, training MSE {mean_squared_error(weights, samples):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
