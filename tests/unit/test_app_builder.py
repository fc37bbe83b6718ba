"""From a config to the Serve application: the LLMConfig a Ray Serve LLM user would write (checked by Ray Serve LLM's
own model), `specserve config render`, and the arguments of the Serve config builder
`specserve.cluster.app:build_from_args` (a config file's keys plus `device`, the server section refused). Building
and deploying the application joins or starts a Ray cluster: tests/serve/test_serve_config_deploy.py does that."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from pydantic import ValidationError

from specserve.cluster.app import AppArgs, ResolvedServe, deployment_config, llm_config, resolve_serve, serve_document
from specserve.cluster.cli import main as cli_main
from specserve.cluster.config import ConfigError, ServeConfig, load_config

GPU_PAIR = {
    "model_loading_config.model_source": "meta-llama/Llama-3.1-8B-Instruct",
    "speculation.draft": "meta-llama/Llama-3.2-1B-Instruct",
    "accelerator_config.kind": "gpu",
}


def test_device_is_required() -> None:
    with pytest.raises(ValidationError, match="device"):
        AppArgs.model_validate({})


def test_the_server_section_is_refused_by_name() -> None:
    with pytest.raises(ValidationError, match="server: not an application argument") as raised:
        AppArgs.model_validate({"device": "cpu", "server": {"api_key": "sk-in-a-config-file"}})
    assert "sk-in-a-config-file" not in str(raised.value)


def test_the_serve_config_checks_apply(tmp_path) -> None:
    with pytest.raises(ValidationError, match="not a Hugging Face model folder"):
        AppArgs.model_validate(
            {"device": "gpu", "model_loading_config": {"model_source": str(tmp_path)}, "speculation": {"draft": "o/d"}}
        )
    with pytest.raises(ValidationError, match="polcy"):
        AppArgs.model_validate({"device": "gpu", "speculation": {"polcy": "adaptive"}})


@pytest.mark.parametrize(("on_gpu", "device"), [(True, {"GPU": 1.0}), (False, {"CPU": 1.0})])
def test_a_placement_bundle_per_rank_reaches_ray_serve_llm_as_written(on_gpu: bool, device: dict) -> None:
    bundle = device | {"pool_a": 1.0, "fast_link": 0.5}
    config = ServeConfig(
        engine_kwargs={"tensor_parallel_size": 2}, placement_group_config={"bundle_per_worker": bundle}
    )
    engine = llm_config(ResolvedServe(config, "/t", "/d", on_gpu=on_gpu, env_vars={})).get_engine_config()
    assert engine.placement_bundles == [bundle] * 2
    assert engine.placement_strategy == "PACK", "Ray Serve LLM's strategy: a TP group on one node where it fits"


def test_without_a_placement_the_bundles_are_ray_serve_llms_default() -> None:
    config = ServeConfig(engine_kwargs={"tensor_parallel_size": 2})
    built = llm_config(ResolvedServe(config, "/t", "/d", on_gpu=True, env_vars={}))
    assert built.placement_group_config is None
    assert built.get_engine_config().placement_bundles == [{"GPU": 1}] * 2


def test_admission_bounds_are_ray_serves_own_with_the_servers_overload_answer() -> None:
    bounded = ServeConfig(
        deployment_config={"max_ongoing_requests": 16, "max_queued_requests": 32},
        server={"overload_status": 429, "retry_after_s": 3},
    )
    options = deployment_config(bounded, on_gpu=True)
    assert (options["max_ongoing_requests"], options["max_queued_requests"]) == (16, 32)
    assert options["backpressure_config"] == {"status_code": 429, "retry_after_s": 3.0}
    plain = deployment_config(ServeConfig(), on_gpu=True)
    assert not {"max_ongoing_requests", "max_queued_requests", "backpressure_config"} & set(plain)
    scaled = deployment_config(ServeConfig(deployment_config={"autoscaling_config": {"max_replicas": 4}}), True)
    assert "num_replicas" not in scaled, "an autoscaler's deployment names no fixed count"


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


def test_a_cpu_engine_keeps_the_demos_sizes_unless_told_and_a_bad_value_is_refused_by_ray_serve_llm() -> None:
    def engine(config: ServeConfig) -> dict:
        return llm_config(ResolvedServe(config, "/t", "/d", on_gpu=False, env_vars={})).engine_kwargs

    assert engine(ServeConfig(engine_kwargs={"dtype": "float32"}))["dtype"] == "float32"
    assert engine(ServeConfig())["max_model_len"] == 512
    assert engine(ServeConfig(engine_kwargs={"max_model_len": 2048}))["max_model_len"] == 2048
    bad = ServeConfig(lora_config={"max_num_adapters_per_replica": 0})
    with pytest.raises(ConfigError, match="lora_config: Invalid lora_config"):
        llm_config(ResolvedServe(bad, "/t", "/d", on_gpu=False, env_vars={}))


def test_a_gpu_config_renders_with_every_value_in_place_and_its_engine_path_set() -> None:
    config = load_config(
        None,
        {
            **GPU_PAIR,
            "engine_kwargs.tensor_parallel_size": 2,
            "engine_kwargs.gpu_memory_utilization": 0.9,
            "engine_kwargs.quantization": "fp8",
            "engine_kwargs.kv_cache_dtype": "fp8",
            "engine_kwargs.max_model_len": 8192,
            "engine_kwargs.enable_prefix_caching": True,
            "accelerator_type": "H100",
        },
    )
    document = serve_document(resolve_serve(config))
    app = document["applications"][0]
    assert app["import_path"] == "ray.serve.llm:build_openai_app"
    (llm,) = app["args"]["llm_configs"]
    engine = llm["engine_kwargs"]
    assert engine["tensor_parallel_size"] == 2 and engine["gpu_memory_utilization"] == 0.9
    assert engine["quantization"] == engine["kv_cache_dtype"] == "fp8" and engine["max_model_len"] == 8192
    assert engine["enable_prefix_caching"] is True
    assert engine["async_scheduling"] is False and llm["runtime_env"]["env_vars"]["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert engine["speculative_config"]["model"] == "meta-llama/Llama-3.2-1B-Instruct"
    assert llm["model_loading_config"] == {
        "model_source": "meta-llama/Llama-3.1-8B-Instruct",
        "model_id": "meta-llama/Llama-3.1-8B-Instruct",
    }
    assert llm["accelerator_type"] == "H100" and llm["accelerator_config"] == {"kind": "gpu"}
    assert app["args"]["ingress_cls_config"]["ingress_cls"] == "specserve.replicas.serve.ingress:SpecServeIngress"


def test_object_storage_becomes_ray_serve_llms_cloud_mirror() -> None:
    config = load_config(None, {**GPU_PAIR, "model_loading_config.model_source": "s3://bucket/llama-8b/"})
    llm = serve_document(resolve_serve(config))["applications"][0]["args"]["llm_configs"][0]
    assert llm["model_loading_config"]["model_source"] == {"bucket_uri": "s3://bucket/llama-8b/"}
    assert llm["model_loading_config"]["model_id"] == "s3://bucket/llama-8b"


def render(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specserve", "config", "render", *args], capture_output=True, text=True, timeout=120
    )


def test_config_render_prints_a_serve_config_and_names_a_bad_flag_with_exit_status_2(tmp_path, capsys) -> None:
    flags = ["--model", "org/target", "--draft", "org/draft", "--device", "gpu", "--tp", "2", "--max-model-len", "8192"]
    own_speculative = 'speculative_config={"draft_tensor_parallel_size": 1, "quantization": "fp8"}'
    done = render(
        *flags,
        *("--engine-arg", "gpu-memory-utilization=0.8", "--engine-arg", "kv_cache_dtype=fp8"),
        *("--engine-arg", own_speculative, "--json"),
    )
    assert done.returncode == 0, done.stderr
    llm = json.loads(done.stdout)["applications"][0]["args"]["llm_configs"][0]
    assert llm["engine_kwargs"]["gpu_memory_utilization"] == 0.8 and llm["engine_kwargs"]["kv_cache_dtype"] == "fp8"
    # vLLM's other speculative settings ride along with specserve's own.
    speculative = llm["engine_kwargs"]["speculative_config"]
    assert speculative["draft_tensor_parallel_size"] == 1 and speculative["quantization"] == "fp8"
    assert speculative["model"] == "org/draft" and speculative["num_speculative_tokens"] == 4
    assert llm["engine_kwargs"]["tensor_parallel_size"] == 2 and llm["engine_kwargs"]["max_model_len"] == 8192
    assert "engine path: vLLM's V1 model runner with synchronous scheduling" in done.stderr
    path = tmp_path / "gpu.yaml"
    # A folder this machine lacks is the GPU nodes' to have: rendered, with a note.
    nodes_only = str(tmp_path / "on-the-gpu-nodes")
    # An autoscaling range without a target never scales on Ray Serve LLM: rendered, with one line saying so.
    scaling = {"autoscaling_config": {"min_replicas": 1, "max_replicas": 4}}
    path.write_text(
        yaml.safe_dump(
            {
                "model_loading_config": {"model_source": nodes_only},
                "speculation": {"draft": "o/d"},
                "deployment_config": scaling,
            }
        )
    )
    as_yaml = render("--config", str(path), "--device", "gpu")
    assert as_yaml.returncode == 0 and as_yaml.stdout.startswith("# specserve config render: vLLM's V1 model runner")
    assert f"model_source: {nodes_only!r} is not on this machine; every node that runs a replica" in as_yaml.stderr
    note = "specserve config render: deployment_config.autoscaling_config has no target_ongoing_requests"
    assert as_yaml.stderr.count(note) == 1 and "ConfigNote" not in as_yaml.stderr
    assert yaml.safe_load(as_yaml.stdout)["applications"][0]["name"] == "specserve"
    for bad, message in (
        (["--engine-arg", "novalue"], "--engine-arg 'novalue': expected KEY=VALUE"),
        (
            ["--engine-arg", 'speculative_config={"num_speculative_tokens": 3}'],
            "engine_kwargs.speculative_config.num_speculative_tokens = 3: set by specserve: write speculation.max_k: 3",
        ),
        (["--max-k", "0"], "speculation.max_k: Input should be greater than or equal to 1"),
    ):
        # In this process: each fails while the config loads, before anything of Ray is imported.
        assert cli_main(["config", "render", *flags, *bad]) == 2
        out = capsys.readouterr()
        assert out.out == "" and message in out.err


def test_config_render_never_prints_a_credential_from_the_config(tmp_path, capfd) -> None:
    path = tmp_path / "gpu.yaml"
    config = {
        "model_loading_config": {"model_source": "org/t"},
        "speculation": {"draft": "o/d"},
        "runtime_env": {"env_vars": {"HF_TOKEN": "hf_secret_value_1", "HF_HUB_OFFLINE": "1"}},
    }
    path.write_text(yaml.safe_dump(config))
    # In this process (the render test above runs the command as its own process): what reaches the two file
    # descriptors, logs included, is what a user would see.
    assert cli_main(["config", "render", "--config", str(path), "--device", "gpu", "--json"]) == 0
    done = capfd.readouterr()
    assert "hf_secret_value_1" not in done.out + done.err
    env = json.loads(done.out)["applications"][0]["args"]["llm_configs"][0]["runtime_env"]["env_vars"]
    assert env["HF_TOKEN"] == "<not printed>" and env["HF_HUB_OFFLINE"] == "1"
    assert "runtime_env.env_vars.HF_TOKEN not printed" in done.err


def test_doctor_exits_1_and_names_the_check_that_failed(monkeypatch, capsys) -> None:
    from specserve.cluster import doctor
    from specserve.replicas.serve.calibration import Calibration
    from specserve.speculation.startup_checks import CheckResult

    checks = (
        CheckResult("k_honoured", "every draft proposal as wide as its step's k", "12 of 40 another width", False),
        CheckResult("k0_no_draft_pass", "skipped on 9", "skipped 9", True),
    )
    monkeypatch.setattr(doctor, "run_doctor", lambda config, *_: (Calibration(checks, (), "fixed:k=4", 1.0), None))
    assert doctor.main(ServeConfig()) == 1
    out = capsys.readouterr()
    row = next(line for line in out.out.splitlines() if line.startswith("k_honoured"))
    assert row.split("  ")[-1] == "FAILED" and "12 of 40 another width" in row
    assert "failed: k_honoured" in out.err
