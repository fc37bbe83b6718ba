"""Shared test set-up: vLLM's environment for CPU engines and the model pairs (built once, cached)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

# vLLM reads these at import and in the processes it spawns, so they are set before any test runs.
_SCRATCH = Path(tempfile.mkdtemp(prefix="specserve-tests-"))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("VLLM_CACHE_ROOT", str(_SCRATCH / "vllm-cache"))
# vLLM leaves ZMQ socket files in TMPDIR; they go into the scratch folder deleted at the end.
os.environ["TMPDIR"] = str(_SCRATCH)
tempfile.tempdir = None


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_SCRATCH, ignore_errors=True)


@pytest.fixture(scope="session")
def scratch() -> Path:
    return _SCRATCH


def _pair(kind: str):
    from specserve.models import cached_pair

    return cached_pair(kind)


@pytest.fixture(scope="session")
def trained_pair():
    return _pair("trained")


@pytest.fixture(scope="session")
def self_pair():
    return _pair("self")


@pytest.fixture(scope="session")
def random_pair():
    return _pair("random")
