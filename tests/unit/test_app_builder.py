"""The arguments of the Serve config builder `specserve.cluster.app:build_from_args`: `specserve serve`'s application
keys plus `device`, the process-only keys refused. (Building the application joins or starts a Ray cluster, as Ray
Serve LLM's builder does, so tests/serve/test_serve_config_deploy.py runs the builder, through `serve run`.)"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from specserve.cluster.app import PROCESS_KEYS, AppArgs


def test_device_is_required() -> None:
    with pytest.raises(ValidationError, match="device"):
        AppArgs.model_validate({})


@pytest.mark.parametrize("key", PROCESS_KEYS)
def test_a_key_of_the_serve_process_is_refused_by_name(key: str) -> None:
    value = {"host": "127.0.0.1", "proxy_location": "HeadOnly"}.get(key, 9000)
    with pytest.raises(ValidationError, match=f"{key}: not an application argument"):
        AppArgs.model_validate({"device": "cpu", key: value})


def test_the_serve_config_checks_apply(tmp_path) -> None:
    with pytest.raises(ValidationError, match="not a Hugging Face model folder"):
        AppArgs.model_validate({"device": "gpu", "model": str(tmp_path), "draft": str(tmp_path)})
    with pytest.raises(ValidationError, match="polcy"):
        AppArgs.model_validate({"device": "gpu", "polcy": "adaptive"})
