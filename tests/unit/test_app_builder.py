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
    value = {"host": "127.0.0.1", "proxy_location": "HeadOnly", "throughput_optimized": True, "haproxy": True}.get(
        key, 9000
    )
    with pytest.raises(ValidationError, match=f"{key}: not an application argument"):
        AppArgs.model_validate({"device": "cpu", key: value})


def test_the_serve_config_checks_apply(tmp_path) -> None:
    with pytest.raises(ValidationError, match="not a Hugging Face model folder"):
        AppArgs.model_validate({"device": "gpu", "model": str(tmp_path), "draft": str(tmp_path)})
    with pytest.raises(ValidationError, match="polcy"):
        AppArgs.model_validate({"device": "gpu", "polcy": "adaptive"})


@pytest.mark.parametrize(("on_gpu", "device"), [(True, {"GPU": 1.0}), (False, {"CPU": 1.0})])
def test_resources_per_rank_join_ray_serve_llms_own_bundle_of_every_rank(on_gpu: bool, device: dict) -> None:
    from specserve.cluster.app import ResolvedServe, llm_config
    from specserve.cluster.config import ServeConfig

    config = ServeConfig(tp=2, resources_per_rank={"pool_a": 1, "fast_link": 0.5})
    engine = llm_config(ResolvedServe(config, "/t", "/d", on_gpu=on_gpu, env_vars={})).get_engine_config()
    assert engine.placement_bundles == [device | {"pool_a": 1.0, "fast_link": 0.5}] * 2
    assert engine.placement_strategy == "PACK", "Ray Serve LLM's strategy: a TP group on one node where it fits"


def test_without_resources_per_rank_the_placement_is_ray_serve_llms_default() -> None:
    from specserve.cluster.app import ResolvedServe, llm_config
    from specserve.cluster.config import ServeConfig

    built = llm_config(ResolvedServe(ServeConfig(tp=2), "/t", "/d", on_gpu=True, env_vars={}))
    assert built.placement_group_config is None
    assert built.get_engine_config().placement_bundles == [{"GPU": 1}] * 2


def test_admission_bounds_become_ray_serves_own_and_are_left_to_its_defaults_unless_set() -> None:
    from specserve.cluster.app import deployment_config
    from specserve.cluster.config import ServeConfig

    bounded = ServeConfig(max_ongoing_requests=16, max_queued_requests=32, overload_status=429, retry_after_s=3)
    options = deployment_config(bounded, on_gpu=True)
    assert (options["max_ongoing_requests"], options["max_queued_requests"]) == (16, 32)
    assert options["backpressure_config"] == {"status_code": 429, "retry_after_s": 3.0}
    plain = deployment_config(ServeConfig(), on_gpu=True)
    assert not {"max_ongoing_requests", "max_queued_requests", "backpressure_config"} & set(plain)


def test_a_serve_config_file_cannot_carry_the_api_key() -> None:
    """Serve shows an application's args in plain text; the builder takes the key from SPECSERVE_API_KEY."""
    with pytest.raises(ValidationError, match="api_key: not an application argument") as raised:
        AppArgs.model_validate({"device": "cpu", "api_key": "sk-in-a-config-file"})
    assert "sk-in-a-config-file" not in str(raised.value)


def test_the_builder_takes_the_api_key_from_the_environment(monkeypatch) -> None:
    from specserve.cluster.app import env_api_key

    monkeypatch.delenv("SPECSERVE_API_KEY", raising=False)
    assert env_api_key() is None
    monkeypatch.setenv("SPECSERVE_API_KEY", "sk-from-env")
    key = env_api_key()
    assert key is not None and key.get_secret_value() == "sk-from-env" and "sk-from-env" not in repr(key)
    monkeypatch.setenv("SPECSERVE_API_KEY", "two words")
    with pytest.raises(ValidationError, match="api_key") as raised:
        env_api_key()
    assert "two words" not in str(raised.value)


def test_the_engines_dtype_is_the_configs_and_an_unknown_one_is_refused_by_name() -> None:
    from specserve.cluster.app import ResolvedServe, llm_config
    from specserve.cluster.config import ServeConfig

    def engine_dtype(config: ServeConfig) -> str:
        return llm_config(ResolvedServe(config, "/t", "/d", on_gpu=False, env_vars={})).engine_kwargs["dtype"]

    assert engine_dtype(ServeConfig(dtype="float32")) == "float32"
    assert engine_dtype(ServeConfig()) != "float32"
    with pytest.raises(ValidationError, match="dtype"):
        ServeConfig(dtype="int8")
