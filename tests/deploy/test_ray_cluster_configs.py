"""deploy/ray-cluster/*.yaml pass the checks `ray up` runs before it launches anything (Ray 2.60's own defaults,
merge and JSON-schema validation) and agree with the Serve config they deploy."""

from __future__ import annotations

import copy
import re
import shlex

import jsonschema
import pytest
from deploy_files import RAY_CLUSTER_CONFIGS, REPO, SERVE_CONFIG, load
from ray.autoscaler._private.util import prepare_config, validate_config

NAMES = [path.name for path in RAY_CLUSTER_CONFIGS]


def test_there_is_one_config_per_place_to_run() -> None:
    assert NAMES == ["aws-gpu.yaml", "gcp-gpu.yaml", "onprem.yaml"]


@pytest.fixture(params=RAY_CLUSTER_CONFIGS, ids=NAMES)
def config(request) -> dict:
    return load(request.param)


def prepared(config: dict) -> dict:
    """The config as `ray up` hands it to the node launcher: defaults filled in, setup commands merged."""
    config = prepare_config(copy.deepcopy(config))
    validate_config(config)
    return config


def test_ray_validates_it(config) -> None:
    full = prepared(config)
    assert full["head_node_type"] in full["available_node_types"]


def test_ray_rejects_a_misspelt_key_in_it(config) -> None:
    config["setup_command"] = config.pop("setup_commands")
    with pytest.raises(jsonschema.ValidationError, match="setup_command"):
        prepared(config)


def test_every_node_installs_this_checkout_with_the_gpu_extra(config) -> None:
    full = prepared(config)
    assert full["file_mounts"] == {"~/specserve": "."}, "ray up runs from the repository root"
    for commands in (full["head_setup_commands"], full["worker_setup_commands"]):
        assert any(re.search(r"pip install .*specserve\[gpu\]", c) for c in commands), commands


def test_the_head_exports_metrics_and_deploys_the_serve_config(config) -> None:
    head = " ; ".join(prepared(config)["head_start_ray_commands"])
    assert "ray start --head" in head and "--metrics-export-port=8080" in head
    deployed = re.search(r"serve deploy ~/specserve/(\S+)", head)
    assert deployed and REPO / deployed.group(1) == SERVE_CONFIG


def test_the_workers_export_metrics_on_the_same_port(config) -> None:
    assert "--metrics-export-port=8080" in " ".join(prepared(config)["worker_start_ray_commands"])


def test_the_workers_download_the_folders_the_serve_config_names_and_the_head_none(config) -> None:
    args = load(SERVE_CONFIG)["applications"][0]["args"]
    wanted = {args["model_loading_config"]["model_source"], args["speculation"]["draft"]}
    full = prepared(config)

    def downloaded(commands: list[str]) -> set[str]:
        return {
            words[words.index("--local-dir") + 1]
            for words in map(shlex.split, commands)
            if "download" in words and "--local-dir" in words
        }

    assert downloaded(full["worker_setup_commands"]) == wanted
    assert downloaded(full["head_setup_commands"]) == set(), "the head runs no engine"


def test_the_head_has_no_gpu_engine(config) -> None:
    assert "--num-gpus=0" in " ".join(prepared(config)["head_start_ray_commands"])


def test_the_files_the_configs_name_exist() -> None:
    for path in RAY_CLUSTER_CONFIGS:
        for relative in re.findall(r"deploy/[\w./-]+\.yaml", path.read_text()):
            assert (REPO / relative).is_file(), f"{path.name} names {relative}"


@pytest.mark.parametrize("name", ["aws-gpu.yaml", "gcp-gpu.yaml"])
def test_a_cloud_cluster_grows_a_gpu_worker_for_every_replica_serve_scales_to(name) -> None:
    full = prepared(load(REPO / "deploy/ray-cluster" / name))
    scaling = load(SERVE_CONFIG)["applications"][0]["args"]["deployment_config"]["autoscaling_config"]
    workers = [t for n, t in full["available_node_types"].items() if n != full["head_node_type"]]
    assert len(workers) == 1, "one GPU worker type"
    (worker,) = workers
    # One engine per GPU worker: the launcher's range holds the deployment's.
    assert worker["min_workers"] <= scaling["min_replicas"]
    assert min(worker["max_workers"], full["max_workers"]) >= scaling["max_replicas"]
