"""deploy/serve/specserve.yaml is a Serve config Ray 2.60 accepts, naming our builder with arguments it takes."""

from __future__ import annotations

import pytest
from deploy_files import SERVE_CONFIG, load
from pydantic import ValidationError
from ray.serve.schema import ServeDeploySchema

from specserve.cluster.app import AppArgs, build_from_args
from specserve.cluster.config import folders_not_here


def test_ray_serve_validates_it() -> None:
    schema = ServeDeploySchema.model_validate(load(SERVE_CONFIG))
    assert [app.name for app in schema.applications] == ["specserve"]
    assert schema.applications[0].route_prefix == "/"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c["applications"][0].pop("import_path"), "import_path"),
        (lambda c: c["http_options"].update(port="eighty"), "port"),
    ],
    ids=["no import_path", "port not a number"],
)
def test_ray_serve_rejects_it_broken(change, message) -> None:
    config = load(SERVE_CONFIG)
    change(config)
    with pytest.raises(ValidationError, match=message):
        ServeDeploySchema.model_validate(config)


def test_every_key_is_one_ray_serve_knows() -> None:
    # Serve's schema ignores unknown keys, so a misspelt optional key would silently do nothing.
    from ray.serve.schema import HTTPOptionsSchema, LoggingConfig, ServeApplicationSchema

    config = load(SERVE_CONFIG)
    assert set(config) <= set(ServeDeploySchema.model_fields)
    assert set(config["http_options"]) <= set(HTTPOptionsSchema.model_fields)
    assert set(config["logging_config"]) <= set(LoggingConfig.model_fields)
    for app in config["applications"]:
        assert set(app) <= set(ServeApplicationSchema.model_fields)


def test_the_import_path_is_the_builder() -> None:
    from ray._common.utils import import_attr

    assert import_attr(load(SERVE_CONFIG)["applications"][0]["import_path"]) is build_from_args


def test_the_builder_takes_its_args_with_folders_only_the_gpu_workers_have() -> None:
    args = load(SERVE_CONFIG)["applications"][0]["args"]
    assert args["device"] == "gpu"
    config = AppArgs.model_validate(args)  # on the head, which has no /models
    assert folders_not_here(config) == [
        ("model_loading_config.model_source", "/models/target"),
        ("speculation.draft", "/models/draft"),
    ]
    assert (config.speculation.policy, config.speculation.max_k, config.num_replicas) == ("adaptive", 4, 2)
    assert config.model_loading_config["model_id"] == "qwen2.5-7b-instruct"
    assert config.engine_kwargs == {"tensor_parallel_size": 1, "max_model_len": 8192, "max_num_seqs": 64}
