"""Paths of the deploy/ files and how to read them, shared by the deploy tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
SERVE_CONFIG = DEPLOY / "serve" / "specserve.yaml"
RAY_CLUSTER_CONFIGS = sorted((DEPLOY / "ray-cluster").glob("*.yaml"))


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())
