"""The Serve config builder `specserve.cluster.app:build_from_args`: its arguments are `specserve serve`'s application
keys plus `device`, Serve accepts it as an application builder, and the process-only keys are refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from specserve.cluster.app import PROCESS_KEYS, AppArgs, build_from_args


def test_device_is_required() -> None:
    with pytest.raises(ValidationError, match="device"):
        AppArgs.model_validate({})


@pytest.mark.parametrize("key", PROCESS_KEYS)
def test_a_key_of_the_serve_process_is_refused_by_name(key: str) -> None:
    value = "127.0.0.1" if key == "host" else 9000
    with pytest.raises(ValidationError, match=f"{key}: not an application argument"):
        AppArgs.model_validate({"device": "cpu", key: value})


def test_the_serve_config_checks_apply(tmp_path) -> None:
    with pytest.raises(ValidationError, match="not a Hugging Face model folder"):
        AppArgs.model_validate({"device": "gpu", "model": str(tmp_path), "draft": str(tmp_path)})
    with pytest.raises(ValidationError, match="polcy"):
        AppArgs.model_validate({"device": "gpu", "polcy": "adaptive"})


def test_serve_calls_it_as_an_application_builder(trained_pair) -> None:
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
    from ray.serve.deployment import Application

    args = {"device": "cpu", "model": str(trained_pair.target), "draft": str(trained_pair.draft), "k_max": 2}
    app = call_user_app_builder_with_args_if_necessary(build_from_args, args)
    assert isinstance(app, Application)
