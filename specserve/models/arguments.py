"""Argument types shared by `specserve models` and `python -m specserve.models` (no heavy imports)."""

from __future__ import annotations

import argparse
from pathlib import Path

KINDS = ("random", "self", "trained")


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
