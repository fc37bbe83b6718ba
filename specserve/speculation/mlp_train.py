"""Train SpecKV's acceptance predictor from a JSONL file of step samples and write the weights JSON.

One JSON object per line, one speculative step of one request (speckv.md §2.4's step-record schema):

    {"mean_draft_entropy": 1.9, "mean_draft_confidence": 0.71, "max_draft_entropy": 3.2,
     "min_draft_confidence": 0.42, "compression": "fp16", "gamma": 4, "acceptance_rate": 0.75}

Entropies in bits; compression is fp16 / int8 / nf4 or its code 0 / 1 / 2; the target is
``acceptance_rate`` (accepted / gamma, the paper's y) or, failing that, a boolean ``accepted`` taken as 0/1.

    python -m specserve.speculation.mlp_train samples.jsonl --out weights.json
    python -m specserve.speculation.mlp_train --synthetic 4000 --out specserve/speculation/mlp_default_weights.json

The second line regenerates the packaged defaults (synthetic, see ``mlp_synthetic``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from specserve.speculation.mlp_fit import Sample, mean_squared_error, train_mlp
from specserve.speculation.mlp_model import COMPRESSION_CODES, FEATURE_NAMES, weights_to_json
from specserve.speculation.mlp_synthetic import synthetic_samples

# Settings the packaged default weights were trained with.
DEFAULT_SYNTHETIC_SEED = 42
DEFAULT_EPOCHS = 100
DEFAULT_LEARNING_RATE = 3e-3


def parse_sample(line: str, line_number: int) -> Sample:
    """One JSONL line as (features, target); errors name the line and the field."""
    try:
        record = json.loads(line)
        compression = record["compression"]
        if isinstance(compression, str):
            compression = COMPRESSION_CODES[compression.lower()]
        values = [float(record[name]) for name in FEATURE_NAMES if name != "compression"]
        values.insert(FEATURE_NAMES.index("compression"), float(compression))
        target = float(record["acceptance_rate"]) if "acceptance_rate" in record else float(bool(record["accepted"]))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"line {line_number}: not a sample ({type(exc).__name__}: {exc})") from None
    if not 0.0 <= target <= 1.0:
        raise ValueError(f"line {line_number}: acceptance_rate={target} must lie in [0, 1]")
    return tuple(values), target


def read_samples(path: Path) -> list[Sample]:
    with path.open() as lines:
        return [parse_sample(line, n) for n, line in enumerate(lines, 1) if line.strip()]


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
    else:
        samples = read_samples(args.samples)
        provenance = f"trained on {args.samples.name} ({len(samples)} samples), epochs={args.epochs}"
    weights = train_mlp(samples, epochs=args.epochs, learning_rate=args.learning_rate, seed=args.seed,
                        provenance=provenance)
    args.out.write_text(weights_to_json(weights))
    print(f"wrote {args.out}: {len(samples)} samples, training MSE {mean_squared_error(weights, samples):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
