"""``python -m lab mlp-samples|train-mlp``: SpecKV training samples from a simulator run, and the mlp policy's
predictor trained on them (``mlp:weights=FILE`` then runs it, in the simulator or on an engine).

``add_commands`` joins these to the group the simulator's command line returns (``specserve.sim.cli``), so they share
its error handling: a bad scenario, policy or file is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from lab.speckv.mlp_dump import DEFAULT_MAX_SAMPLES, collect_samples, default_policy, write_samples
from lab.speckv.training import DEFAULT_EPOCHS, DEFAULT_LEARNING_RATE, mean_squared_error, train_file
from specserve.sim.cli import CommandError
from specserve.sim.oracle import check_policy
from specserve.sim.scenario import load_scenario, resolve
from specserve.speculation import EngineTraits
from specserve.speculation.speckv.model import COMPRESSION_CODES, weights_to_json


def add_commands(commands: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """Add ``mlp-samples`` and ``train-mlp`` to a command group; returns the group."""
    samples = commands.add_parser("mlp-samples", help="write SpecKV training samples (JSONL) from one scenario run")
    samples.add_argument("--scenario", required=True, help="built-in name (see `specserve sim scenarios`) or YAML file")
    samples.add_argument("--policy", help="policy spec to run (default: cycle over gammas 2-4-6-8 up to max_k)")
    samples.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    samples.add_argument("--seed", type=int, default=0, help="run and subsampling seed (default: 0)")
    samples.add_argument(
        "--compression",
        default="fp16",
        choices=tuple(COMPRESSION_CODES),
        help="the target's quantization, written into every sample (default: fp16)",
    )
    samples.add_argument(
        "--max-samples",
        type=int,
        default=DEFAULT_MAX_SAMPLES,
        help=f"keep a seeded random subset of at most this many (default: {DEFAULT_MAX_SAMPLES})",
    )
    samples.set_defaults(sim_handler=_mlp_samples)
    train = commands.add_parser("train-mlp", help="train the mlp policy's predictor on a samples JSONL file")
    train.add_argument("samples", type=Path, help="JSONL samples, e.g. from `python -m lab mlp-samples`")
    train.add_argument("--out", type=Path, required=True, help="weights JSON to write; use it as mlp:weights=FILE")
    train.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS, help=f"default: {DEFAULT_EPOCHS}")
    train.add_argument(
        "--learning-rate", type=float, default=DEFAULT_LEARNING_RATE, help=f"default: {DEFAULT_LEARNING_RATE:g}"
    )
    train.add_argument("--seed", type=int, default=42, help="initialisation and shuffling seed (default: 42)")
    train.set_defaults(sim_handler=_train_mlp)
    return commands


def _mlp_samples(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.scenario)
    resolve(scenario)
    spec = args.policy or default_policy(scenario.engine.max_k)
    traits = EngineTraits(max_k=scenario.engine.max_k, k0_runs_draft_pass=scenario.engine.k0_runs_draft_pass)
    try:
        check_policy(spec, traits)
    except ValueError as exc:
        raise CommandError(f"bad policy {spec!r}: {exc}") from None
    if args.max_samples < 1:
        raise CommandError(f"--max-samples {args.max_samples} must be at least 1")
    if not scenario.acceptance.signals.enabled:
        raise CommandError(f"scenario {scenario.name!r} has acceptance.signals.enabled false: no signals to sample")
    samples, seen = collect_samples(scenario, spec, args.seed, args.compression, args.max_samples)
    if not samples:
        raise CommandError(f"scenario {scenario.name!r} under {spec!r} ran no speculative step: no samples")
    _write(args.out, lambda path: write_samples(path, samples))
    print(
        f"wrote {args.out}: {len(samples)} of {seen} samples ({scenario.name}, {spec}, seed {args.seed})",
        file=sys.stderr,
    )
    return 0


def _train_mlp(args: argparse.Namespace) -> int:
    if not args.samples.is_file():
        raise CommandError(f"samples file {str(args.samples)!r} not found")
    if args.epochs < 1:
        raise CommandError(f"--epochs {args.epochs} must be at least 1")
    if not args.learning_rate > 0:
        raise CommandError(f"--learning-rate {args.learning_rate} must be positive")
    try:
        weights, samples = train_file(
            args.samples, epochs=args.epochs, learning_rate=args.learning_rate, seed=args.seed
        )
    except ValueError as exc:
        raise CommandError(f"samples file {str(args.samples)!r}: {exc}") from None
    _write(args.out, lambda path: path.write_text(weights_to_json(weights)))
    print(
        f"wrote {args.out}: {len(samples)} samples, training MSE {mean_squared_error(weights, samples):.4f}; "
        f"use it as mlp:weights={args.out}",
        file=sys.stderr,
    )
    return 0


def _write(path: Path, write: Callable[[Path], object]) -> None:
    try:
        write(path)
    except OSError as exc:
        raise CommandError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None
