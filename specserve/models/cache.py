"""A build-once cache of model pairs, shared by ``make serve``, ``make test`` and concurrent builders.

Layout: ``<root>/<kind>[-<options>]-<BUILD_VERSION>-py<major><minor>/{target,draft,specserve_build.json}``
(options: the perf pair's size and agreement, e.g. ``perf-S-a0.8-v1-py311``); a draft head for the trained pair's
target (``cached_head``) lives in ``<root>/<kind>-<HEAD_VERSION>-trained-<BUILD_VERSION>-py<major><minor>/head``, with
``<root>`` = ``$SPECSERVE_CACHE`` if set, else ``~/.cache/specserve/models``. The Python version is
part of the key because the training corpus is that interpreter's standard library.

A pair is built in a temporary folder beside its final place and renamed into it, so a folder at the
final path is always complete. A per-key file lock makes a second concurrent builder wait and then
reuse the first one's result instead of building again; if locking is unavailable the rename still
guarantees that exactly one complete build wins.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specserve.models.build import BUILD_INFO_FILE, BUILD_VERSION, PairPaths, make_pair, pair_options
from specserve.models.heads import HEAD_VERSION, HeadPaths, head_kind, head_paths, make_head

CACHE_ENV = "SPECSERVE_CACHE"


def cache_root() -> Path:
    """Where cached pairs live: ``$SPECSERVE_CACHE``, else ``~/.cache/specserve/models``."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "specserve" / "models"


def cache_key(kind: str, **options: Any) -> str:
    """The folder name of a cached pair: kind, its options (defaults filled in), build version and
    Python minor version."""
    options = pair_options(kind, options)
    parts = [kind, *(_option_part(name, value) for name, value in options.items())]
    return f"{'-'.join(parts)}-{BUILD_VERSION}-py{sys.version_info.major}{sys.version_info.minor}"


def _option_part(name: str, value: object) -> str:
    return f"a{value:g}" if name == "agreement" else str(value)


def cached_pair(kind: str, cache_dir: Path | None = None, *, progress: bool = True, **options: Any) -> PairPaths:
    """The pair ``kind`` from the cache, building it first (seed 0) if it is not there yet; ``options``
    as ``make_pair``'s, e.g. ``cached_pair("perf", size="S", agreement=0.8)``."""
    options = pair_options(kind, options)
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    key = cache_key(kind, **options)
    final = root / key
    if is_complete(final):
        return PairPaths.under(final)
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(root / f".{key}.lock"):
        if not is_complete(final):  # another process may have finished while we waited
            _build_and_publish(kind, final, progress=progress, options=options)
    return PairPaths.under(final)


def cached_head(kind: str = "eagle3", cache_dir: Path | None = None, *, progress: bool = True) -> Path:
    """The draft head ``kind`` (specserve.models.heads.HEAD_KINDS) for ``cached_pair("trained").target``, from the
    cache, building it first (seed 0) if it is not there yet: the folder to pass as speculative_config["model"]."""
    return cached_head_paths(kind, cache_dir, progress=progress).head


def cached_head_paths(kind: str = "eagle3", cache_dir: Path | None = None, *, progress: bool = True) -> HeadPaths:
    """``cached_head``'s target and head folders."""
    head_kind(kind)
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    target = cached_pair("trained", root, progress=progress).target
    key = f"{kind}-{HEAD_VERSION}-trained-{BUILD_VERSION}-py{sys.version_info.major}{sys.version_info.minor}"
    final = root / key
    if not is_complete(final):
        with _exclusive_lock(root / f".{key}.lock"):
            if not is_complete(final):
                _publish(final, lambda staging: make_head(kind, staging, target, progress=progress))
    return head_paths(kind, final, target)


def is_complete(pair_dir: Path) -> bool:
    """True when ``pair_dir`` holds a finished build (the build-info file is written last)."""
    return (pair_dir / BUILD_INFO_FILE).is_file()


def _build_and_publish(kind: str, final: Path, *, progress: bool, options: dict[str, Any]) -> None:
    _publish(final, lambda staging: make_pair(kind, staging, progress=progress, **options))


def _publish(final: Path, build: Callable[[Path], object]) -> None:
    """Run ``build`` into a staging folder beside ``final`` and rename it into place."""
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the published pair should read like any folder
    try:
        build(staging)
        try:
            os.rename(staging, final)  # atomic on one filesystem; fails if `final` already exists
        except OSError as err:
            if not is_complete(final):  # not a finished build: leave it for a human to inspect
                raise FileExistsError(f"{final} exists but holds no finished build; remove it") from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
