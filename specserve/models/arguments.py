"""Argument types shared by `specserve models` and `python -m specserve.models` (no heavy imports)."""

from __future__ import annotations

import argparse
from pathlib import Path

KINDS = ("perf", "random", "self", "trained")
# Draft heads built for the trained pair's target (specserve.models.heads).
HEAD_KINDS = ("eagle3", "mtp")
# Sizes of the perf pair (specserve.models.perf.PERF_SIZES) and its default agreement.
PERF_SIZE_NAMES = ("S", "M")
DEFAULT_PERF_SIZE = "S"
DEFAULT_AGREEMENT = 0.8  # about the trained pair's position-0 acceptance


def model_dir(value: str) -> Path:
    path = Path(value)
    if not (path / "config.json").is_file():
        raise argparse.ArgumentTypeError(f"not a model folder (no config.json): {value!r}")
    return path


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value!r}")
    return number


def perf_size(value: str) -> str:
    if value not in PERF_SIZE_NAMES:
        raise argparse.ArgumentTypeError(f"unknown size {value!r}; expected one of {', '.join(PERF_SIZE_NAMES)}")
    return value


def fraction(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not 0.0 <= number <= 1.0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {value!r}")
    return number


def perf_options(args: argparse.Namespace) -> dict[str, object]:
    """The builder options of ``make`` / ``cached``: size and agreement for perf, nothing otherwise."""
    given = {name: value for name, value in (("size", args.size), ("agreement", args.agreement)) if value is not None}
    if given and args.kind != "perf":
        raise SystemExit(f"only --kind perf takes --{' or --'.join(given)} (got --kind {args.kind})")
    return given


def add_commands(parser: argparse.ArgumentParser, dest: str) -> None:
    """The ``make`` / ``cached`` / ``measure`` sub-commands, for ``specserve models`` and
    ``python -m specserve.models`` alike; the chosen one lands in ``args.<dest>``."""
    commands = parser.add_subparsers(dest=dest, required=True)

    make = commands.add_parser("make", help="build a model pair into a folder")
    make.add_argument("--kind", required=True, choices=KINDS + HEAD_KINDS, help="which pair or draft head to build")
    make.add_argument(
        "--out", required=True, type=Path, help="folder to create target/ and draft/ in (a head kind: head/)"
    )
    make.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    make.add_argument("--no-progress", action="store_true", help="hide the training progress bar")
    add_perf_options(make)

    cached = commands.add_parser("cached", help="print a cached pair's folders, building it once")
    cached.add_argument("--kind", required=True, choices=KINDS + HEAD_KINDS, help="which pair or draft head")
    cached.add_argument("--cache-dir", type=Path, default=None, help="cache root (default $SPECSERVE_CACHE)")
    cached.add_argument("--no-progress", action="store_true", help="hide the training progress bar")
    add_perf_options(cached)

    measure = commands.add_parser("measure", help="measure greedy acceptance in a vLLM engine")
    measure.add_argument("--target", required=True, type=model_dir, help="target model folder")
    measure.add_argument("--draft", required=True, type=model_dir, help="draft model folder")
    measure.add_argument("--k", type=positive_int, default=4, help="draft tokens per step (default 4)")
    measure.add_argument("--num-prompts", type=positive_int, default=8, help="prompts (default 8)")
    measure.add_argument("--max-tokens", type=positive_int, default=64, help="tokens per prompt (default 64)")


def add_perf_options(
    parser: argparse.ArgumentParser, *, size: str | None = None, agreement: float | None = None
) -> None:
    """``--size`` and ``--agreement``, validated; defaults None leave the builder's own (``perf_options``)."""
    group = parser.add_argument_group("perf pair (--kind perf)")
    group.add_argument(
        "--size",
        type=perf_size,
        default=size,
        metavar="{" + ",".join(PERF_SIZE_NAMES) + "}",
        help=f"how costly the target is; M's is twice as deep as S's, the draft the same (default {DEFAULT_PERF_SIZE})",
    )
    group.add_argument(
        "--agreement",
        type=fraction,
        default=agreement,
        metavar="A",
        help=f"greedy agreement of draft and target, 0..1, calibrated at build (default {DEFAULT_AGREEMENT})",
    )
