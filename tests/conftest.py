"""Shared test set-up: vLLM's environment for CPU engines and the model pairs (built once, cached)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from specserve.replicas.config import engine_env

# vLLM reads these at import and in the processes it spawns, so they are set before any test runs:
# the same settings as `specserve serve`'s engines, with vLLM's caches and ZMQ socket files in a
# scratch folder deleted at the end.
_SCRATCH = Path(tempfile.mkdtemp(prefix="specserve-tests-"))
engine_env.apply(engine_env.engine_env(_SCRATCH))


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
