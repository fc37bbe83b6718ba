"""Draft heads built for the trained pair's target: what each kind is, and the one entry point that builds them.

- ``eagle3``: an EAGLE-3 head (specserve.models.eagle3) trained on the target's aux hidden states; serve the trained
  target with ``speculative_config={"method": "eagle3", "model": <head>, ...}``.
- ``mtp``: the trained target itself as a MiMo model with one trained MTP layer (specserve.models.mtp); it is a new
  target folder: serve it with ``speculative_config={"method": "mtp", ...}`` (``model`` may be left out or name the
  same folder).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specserve.models.arguments import HEAD_KINDS

# Bump when anything that changes a built head changes (architecture, recipe, aux layers); the trained target's own
# version (BUILD_VERSION) is part of the cache key besides.
HEAD_VERSION = "h1"
# The head's folder inside a build's output folder, beside specserve_build.json.
HEAD_DIR = "head"
# vLLM's speculative method for each head kind.
HEAD_METHODS = {"eagle3": "eagle3", "mtp": "mtp"}
assert tuple(sorted(HEAD_METHODS)) == HEAD_KINDS, "specserve.models.arguments.HEAD_KINDS lists the head kinds"


@dataclass(frozen=True, slots=True)
class HeadPaths:
    """A built head: serve ``target`` with speculative_config {"method": HEAD_METHODS[kind], "model": head}; for
    ``mtp`` both are the one MiMo folder."""

    target: Path
    head: Path


def head_paths(kind: str, out_dir: Path, target_dir: Path) -> HeadPaths:
    """Where a build of ``kind`` into ``out_dir`` puts its folders: an MTP build is a target of its own."""
    head = Path(out_dir) / HEAD_DIR
    return HeadPaths(target=head if head_kind(kind) == "mtp" else Path(target_dir), head=head)


def head_kind(kind: str) -> str:
    if kind not in HEAD_METHODS:
        raise ValueError(f"unknown draft head kind {kind!r}; expected one of {sorted(HEAD_METHODS)}")
    return kind


def make_head(kind: str, out_dir: Path, target_dir: Path, *, seed: int = 0, progress: bool = True) -> HeadPaths:
    """Build the head ``kind`` for the target in ``target_dir`` (the trained pair's) under ``out_dir``."""
    head_kind(kind)
    # torch and transformers take seconds to import
    if kind == "mtp":
        from specserve.models import mtp

        return mtp.make_mtp_target(Path(out_dir), Path(target_dir), seed=seed, progress=progress)
    from specserve.models import eagle3

    return eagle3.make_eagle3_head(Path(out_dir), Path(target_dir), seed=seed, progress=progress)
