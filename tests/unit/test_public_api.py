"""The public Python API (`specserve.speculative_llm_config` and friends): what it adds to a Ray Serve LLM config,
what it leaves alone, what it refuses, and that `import specserve` stays light."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
from pydantic import ValidationError

import specserve
from specserve.llm import OWNED_ENGINE_KWARGS, SERVER_CLS, ConfigNote, Speculation
from specserve.replicas.config.engine_args import (
    CPU_EXECUTOR_KEY,
    DraftOffload,
    EngineControlConfig,
    EngineSpec,
    speculative_engine_kwargs,
)

FRAMEWORKS = ("ray", "vllm", "torch")


def test_importing_specserve_and_building_the_kwargs_loads_no_framework() -> None:
    code = (
        "import sys, specserve; "
        "specserve.speculative_llm_config_kwargs('draft', device='cpu'); "
        "specserve.speculative_llm_config({'model_loading_config': {'model_id': 'm'}}, draft='d'); "
        f"print(sorted(m for m in {list(FRAMEWORKS)!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_public_names_are_exported_and_unknown_ones_are_not() -> None:
    assert set(specserve.__all__) == {
        "ConfigNote",
        "CpuEngine",
        "Speculation",
        "build_openai_app",
        "speculative_llm_config",
        "speculative_llm_config_kwargs",
    }
    assert specserve.Speculation is Speculation and specserve.ConfigNote is ConfigNote
    with pytest.raises(AttributeError, match="no_such_name"):
        specserve.no_such_name  # noqa: B018


def test_gpu_kwargs_carry_the_replica_class_speculation_and_the_engine_path_and_no_cpu_settings() -> None:
    kwargs = specserve.speculative_llm_config_kwargs("org/draft", policy="fixed:k=2", max_k=3)
    assert set(kwargs) == {"server_cls", "engine_kwargs", "experimental_configs", "runtime_env"}
    assert kwargs["server_cls"] == SERVER_CLS
    engine = kwargs["engine_kwargs"]
    assert engine["speculative_config"]["model"] == "org/draft"
    assert engine["speculative_config"]["num_speculative_tokens"] == 3
    assert engine["additional_config"]["specserve"]["policy"] == "fixed:k=2"
    assert engine["enforce_eager"] is False
    assert "enable_prefix_caching" not in engine, "vLLM's default (on) stands"
    # The one engine path whose k control the tests cover: the V1 runner, synchronous scheduling.
    assert engine["async_scheduling"] is False
    assert kwargs["runtime_env"] == {"env_vars": {"VLLM_USE_V2_MODEL_RUNNER": "0"}}
    assert CPU_EXECUTOR_KEY not in kwargs["experimental_configs"]
    assert "model" not in engine, "the model belongs in model_loading_config"


def test_cpu_kwargs_add_the_cpu_accelerator_and_the_engine_environment() -> None:
    kwargs = specserve.speculative_llm_config_kwargs("d", device="cpu", cpu={"kv_cache_space_gib": 3, "executor": "mp"})
    assert kwargs["accelerator_config"] == {"kind": "cpu"}
    env = kwargs["runtime_env"]["env_vars"]
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert "TMPDIR" not in env and "VLLM_CACHE_ROOT" not in env, "a deployment keeps vLLM's own folders"
    assert kwargs["engine_kwargs"]["enforce_eager"] is True and "async_scheduling" not in kwargs["engine_kwargs"]
    assert kwargs["experimental_configs"][CPU_EXECUTOR_KEY] == "mp"


def test_the_callers_engine_kwargs_pass_through_and_win_over_defaults() -> None:
    engine = specserve.speculative_llm_config_kwargs(
        "d", engine_kwargs={"tensor_parallel_size": 2, "max_num_seqs": 32, "enforce_eager": True}
    )["engine_kwargs"]
    assert engine["tensor_parallel_size"] == 2 and engine["enforce_eager"] is True
    # vLLM's batch-size table spans the caller's batch size.
    assert engine["speculative_config"]["num_speculative_tokens_per_batch_size"] == [[1, 32, 4]]


@pytest.mark.parametrize("key", OWNED_ENGINE_KWARGS)
def test_an_engine_argument_specserve_sets_is_refused_by_name(key: str) -> None:
    with pytest.raises(ValueError, match=key):
        specserve.speculative_llm_config_kwargs("d", engine_kwargs={key: True})


def test_the_callers_own_speculative_settings_pass_through_and_win_over_specserves() -> None:
    mine = {"prompt_lookup_max": 6, "prompt-lookup-min": 3, "draft_tensor_parallel_size": 1}
    engine = specserve.speculative_llm_config_kwargs(
        None, method="ngram", max_k=3, engine_kwargs={"speculative_config": mine}
    )["engine_kwargs"]
    spec = engine["speculative_config"]
    assert (spec["prompt_lookup_max"], spec["prompt_lookup_min"], spec["draft_tensor_parallel_size"]) == (6, 3, 1)
    assert spec["method"] == "ngram" and spec["num_speculative_tokens"] == 3
    assert "prompt-lookup-min" not in spec  # as vLLM reads it: one spelling, the caller's value
    assert mine == {"prompt_lookup_max": 6, "prompt-lookup-min": 3, "draft_tensor_parallel_size": 1}


@pytest.mark.parametrize(
    ("key", "value", "instead"),
    [
        ("method", "eagle3", "write speculation.method: eagle3 instead"),
        ("model", "org/head", "write speculation.draft: org/head instead"),
        ("num-speculative-tokens", 3, "write speculation.max_k: 3 instead"),
        ("num_speculative_tokens_per_batch_size", [[1, 8, 2]], "chooses k at every step"),
    ],
)
def test_a_speculative_setting_specserve_owns_is_refused_with_what_to_write(
    key: str, value: object, instead: str
) -> None:
    with pytest.raises(ValueError, match=f"engine_kwargs.speculative_config.{key.replace('-', '_')} = .*{instead}"):
        specserve.speculative_llm_config_kwargs("d", engine_kwargs={"speculative_config": {key: value}})
    with pytest.raises(ValueError, match="is not a mapping"):
        specserve.speculative_llm_config_kwargs("d", engine_kwargs={"speculative_config": "ngram"})


def test_vllm_builds_its_speculative_config_from_what_specserve_passes(trained_pair) -> None:
    """What ``EngineArgs.create_speculative_config`` does with the engine arguments, on the pinned vLLM."""
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

    engine = specserve.speculative_llm_config_kwargs(
        None, method="ngram", max_k=3, engine_kwargs={"speculative_config": {"prompt_lookup_max": 6}}
    )["engine_kwargs"]
    target = ModelConfig(model=str(trained_pair.target), max_model_len=256)
    config = SpeculativeConfig(
        **engine["speculative_config"], target_model_config=target, target_parallel_config=ParallelConfig()
    )
    assert (config.method, config.num_speculative_tokens, config.prompt_lookup_max) == ("ngram", 3, 6)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"polcy": "adaptive"}, "polcy"),
        ({"policy": "no-such-policy"}, "policy"),
        ({"policy": "fixed:k=6", "max_k": 4}, "k=6"),
        ({"max_k": 17}, "max_k"),
        ({"draft_offload": True, "skip_k0_draft_pass": False}, "skip_k0_draft_pass"),
    ],
)
def test_bad_options_are_errors_that_name_them(options: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        specserve.speculative_llm_config_kwargs("d", **options)


def test_a_dict_config_keeps_its_fields_and_merges_ours() -> None:
    mine = {
        "model_loading_config": {"model_id": "m", "model_source": "/t"},
        "accelerator_config": {"kind": "cpu"},
        "deployment_config": {"num_replicas": 3},
        "engine_kwargs": {"max_model_len": 256},
        "runtime_env": {"env_vars": {"VLLM_CPU_KVCACHE_SPACE": "7", "MINE": "1"}, "pip": ["x"]},
        "experimental_configs": {"stream_batching_interval_ms": 5},
    }
    out = specserve.speculative_llm_config(mine, draft="/d")
    assert mine["engine_kwargs"] == {"max_model_len": 256}, "the caller's config is not changed"
    assert out["deployment_config"] == {"num_replicas": 3}
    assert out["model_loading_config"] == mine["model_loading_config"]
    assert out["engine_kwargs"]["max_model_len"] == 256 and out["engine_kwargs"]["enforce_eager"] is True
    assert out["runtime_env"]["pip"] == ["x"]
    env = out["runtime_env"]["env_vars"]
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "7" and env["MINE"] == "1", "the caller's variables win"
    assert "VLLM_CPU_OMP_THREADS_BIND" in env
    assert out["experimental_configs"]["stream_batching_interval_ms"] == 5
    assert out["experimental_configs"][CPU_EXECUTOR_KEY] == "uni"


def test_a_config_that_already_speculates_keeps_its_method_head_and_token_count_under_specserves_control() -> None:
    vllm_speculation = {"method": "eagle3", "model": "org/head", "num_speculative_tokens": 3, "quantization": "fp8"}
    mine = {"model_loading_config": {"model_id": "m"}, "engine_kwargs": {"speculative_config": vllm_speculation}}
    out = specserve.speculative_llm_config(mine, policy="adaptive")
    spec = out["engine_kwargs"]["speculative_config"]
    assert (spec["method"], spec["model"], spec["num_speculative_tokens"], spec["quantization"]) == (
        "eagle3",
        "org/head",
        3,
        "fp8",
    )
    assert out["server_cls"] == SERVER_CLS and "additional_config" in out["engine_kwargs"]
    assert mine["engine_kwargs"]["speculative_config"] is vllm_speculation and len(vllm_speculation) == 4
    # Given here too, the same value is fine; another is an error naming both.
    assert specserve.speculative_llm_config(mine, draft="org/head", max_k=3)["engine_kwargs"] == out["engine_kwargs"]
    with pytest.raises(ValueError, match="num_speculative_tokens = 3 and max_k=4 disagree"):
        specserve.speculative_llm_config(mine, max_k=4)
    with pytest.raises(ValueError, match="model = 'org/head' and draft='org/other' disagree"):
        specserve.speculative_llm_config(mine, draft="org/other")


def test_a_dict_config_without_an_accelerator_is_a_gpu_one() -> None:
    out = specserve.speculative_llm_config({"model_loading_config": {"model_id": "m"}}, draft="/d")
    assert out["runtime_env"]["env_vars"] == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    assert out["engine_kwargs"]["enforce_eager"] is False


def test_adding_speculation_changes_nothing_else_the_user_set() -> None:
    mine = {
        "model_loading_config": {"model_id": "m", "model_source": "org/target"},
        "engine_kwargs": {"enable_prefix_caching": False, "gpu_memory_utilization": 0.8, "quantization": "fp8"},
        "deployment_config": {
            "autoscaling_config": {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 64}
        },
        "runtime_env": {"env_vars": {"HF_HUB_OFFLINE": "1"}},
    }
    out = specserve.speculative_llm_config(mine, draft="org/draft")
    for key, value in mine["engine_kwargs"].items():
        assert out["engine_kwargs"][key] == value
    assert out["deployment_config"] == mine["deployment_config"]
    assert out["runtime_env"]["env_vars"]["HF_HUB_OFFLINE"] == "1"


def test_an_engine_path_on_which_k_does_nothing_is_refused_by_name() -> None:
    base = {"model_loading_config": {"model_id": "m"}}
    with pytest.raises(ValueError, match="VLLM_USE_V2_MODEL_RUNNER='1': specserve's k control runs on"):
        specserve.speculative_llm_config({**base, "runtime_env": {"env_vars": {"VLLM_USE_V2_MODEL_RUNNER": "1"}}}, "d")
    with pytest.raises(ValueError, match="engine_kwargs.async_scheduling: true"):
        specserve.speculative_llm_config({**base, "engine_kwargs": {"async_scheduling": True}}, draft="d")


@pytest.mark.parametrize(
    ("key", "instead"),
    [("pipeline_parallel_size", "tensor_parallel_size instead"), ("data_parallel_size", "num_replicas")],
)
def test_an_engine_that_steps_more_than_one_batch_at_a_time_is_refused_by_name(key, instead) -> None:
    base = {"model_loading_config": {"model_id": "m"}}
    with pytest.raises(ValueError, match=f"engine_kwargs.{key} = 2: not supported: .*{instead}"):
        specserve.speculative_llm_config({**base, "engine_kwargs": {key: 2}}, draft="d")
    kept = specserve.speculative_llm_config({**base, "engine_kwargs": {key: 1}}, draft="d")
    assert kept["engine_kwargs"][key] == 1


def test_the_old_spellings_still_work_this_release_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="k_max is now max_k"):
        kwargs = specserve.speculative_llm_config_kwargs("d", k_max=2)
    assert kwargs["engine_kwargs"]["speculative_config"]["num_speculative_tokens"] == 2
    with pytest.warns(DeprecationWarning, match="CPU options now go in cpu="):
        kwargs = specserve.speculative_llm_config_kwargs("d", device="cpu", kv_cache_space_gib=3)
    assert kwargs["runtime_env"]["env_vars"]["VLLM_CPU_KVCACHE_SPACE"] == "3"


def test_build_openai_app_puts_specserves_ingress_in_front_and_writes_no_key() -> None:
    args = specserve.llm.openai_app_args([{"model_loading_config": {"model_id": "m"}}], retry_after_s=2.0)
    assert args["ingress_cls_config"] == {
        "ingress_cls": "specserve.replicas.serve.ingress:SpecServeIngress",
        "ingress_extra_kwargs": {"retry_after_s": 2.0},
    }


def test_someone_elses_server_class_is_refused_and_a_subclass_of_ours_kept() -> None:
    from ray.serve.llm.deployment import LLMServer

    from specserve.replicas.serve.server import SpecLLMServer

    class Mine(SpecLLMServer):
        pass

    base = {"model_loading_config": {"model_id": "m"}}
    for other in (LLMServer, "ray.serve.llm.deployment.LLMServer"):
        with pytest.raises(ValueError, match="server_cls"):
            specserve.speculative_llm_config({**base, "server_cls": other}, draft="/d")
    assert specserve.speculative_llm_config({**base, "server_cls": Mine}, draft="/d")["server_cls"] is Mine


def test_an_llm_config_comes_back_as_an_llm_config_with_our_replica_class() -> None:
    from ray.serve.llm import LLMConfig

    from specserve.replicas.serve.server import SpecLLMServer

    mine = LLMConfig(
        model_loading_config={"model_id": "m", "model_source": "/t"},
        accelerator_config={"kind": "cpu"},
        deployment_config={"num_replicas": 2},
        engine_kwargs={"max_model_len": 256},
    )
    out = specserve.speculative_llm_config(mine, draft="/d", max_k=2)
    assert isinstance(out, LLMConfig) and out is not mine
    assert out.server_cls is SpecLLMServer
    assert out.deployment_config == {"num_replicas": 2} and out.model_id == "m"
    assert out.accelerator_config.kind == "cpu"
    assert out.engine_kwargs["speculative_config"]["num_speculative_tokens"] == 2
    assert out.runtime_env["env_vars"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert mine.server_cls is None


def test_serve_builds_its_llm_config_through_the_public_api_with_the_same_engine_arguments() -> None:
    from specserve.cluster.app import ResolvedServe, llm_config
    from specserve.cluster.config import ServeConfig

    config = ServeConfig(
        speculation={
            "policy": "fixed:k=2",
            "max_k": 3,
            "draft_offload": True,
            "offload_min_resident_s": 2.0,
            "catch_up_max_tokens": 96,
        },
        engine_kwargs={"max_num_seqs": 4, "stream_interval": 4},
        cpu={"executor": "mp"},
    )
    built = llm_config(ResolvedServe(config, "/t", "/d", on_gpu=False, env_vars={"TMPDIR": "/scratch"}))
    spec = config.speculation
    expected = speculative_engine_kwargs(
        EngineSpec(
            target="/t",
            draft="/d",
            policy="fixed:k=2",
            max_k=3,
            max_num_seqs=4,
            draft_offload=DraftOffload(spec.offload_low_free_ratio, spec.offload_window_steps, 2.0),
            catch_up_max_tokens=96,
            stream_interval=4,
        )
    )
    # model and tokenizer come from model_loading_config (vLLM's tokenizer defaults to the model); a TP size only
    # where the config sets one.
    for key in ("model", "tokenizer", "tensor_parallel_size"):
        expected.pop(key)
    assert built.engine_kwargs == expected
    control = EngineControlConfig.from_additional_config(built.engine_kwargs["additional_config"]["specserve"])
    assert control.draft_offload is not None and control.draft_offload.min_resident_s == 2.0
    assert control.catch_up_max_tokens == 96
    assert built.experimental_configs[CPU_EXECUTOR_KEY] == "mp"
    assert built.runtime_env["env_vars"]["TMPDIR"] == "/scratch"


def test_an_autoscaling_range_without_a_target_is_noted_as_ray_serve_llm_would_never_scale_it() -> None:
    from ray.llm._internal.common.dict_utils import maybe_apply_llm_deployment_config_defaults
    from ray.llm._internal.serve.core.server.builder import DEFAULT_DEPLOYMENT_OPTIONS

    scaling = {"min_replicas": 1, "max_replicas": 4}
    # The note's premise, Ray Serve LLM 2.60's own merge: this fails when Ray's default changes.
    merged = maybe_apply_llm_deployment_config_defaults(DEFAULT_DEPLOYMENT_OPTIONS, {"autoscaling_config": scaling})
    assert merged["autoscaling_config"]["target_ongoing_requests"] >= 10**9
    base = {"model_loading_config": {"model_id": "m"}}
    with pytest.warns(ConfigNote, match="autoscaling_config has no target_ongoing_requests"):
        out = specserve.speculative_llm_config({**base, "deployment_config": {"autoscaling_config": scaling}}, "d")
    assert out["deployment_config"] == {"autoscaling_config": scaling}, "noted, not changed"
    for quiet in (
        {"num_replicas": 2},
        {"autoscaling_config": {**scaling, "target_ongoing_requests": 48}},
        {"autoscaling_config": {**scaling, "policy": {"policy_function": "my.module:policy"}}},
        {"autoscaling_config": {"min_replicas": 2, "max_replicas": 2}},
        {"autoscaling_config": {"min_replicas": 1, "max_replicas": "4"}},  # Ray Serve's validation names it
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("error", ConfigNote)
            specserve.speculative_llm_config({**base, "deployment_config": quiet}, "d")
