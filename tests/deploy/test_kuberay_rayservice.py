"""deploy/kuberay/rayservice.yaml against the RayService CRD of KubeRay v1.7.0 (vendored in deploy/kuberay/crd/).

Kubernetes drops fields a CRD does not declare unless field validation is strict (`kubectl apply
--validate=strict`); the schema is checked the strict way, so a misspelt field is an error here too.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest
import yaml
from deploy_files import DEPLOY, SERVE_CONFIG, load

RAYSERVICE = DEPLOY / "kuberay" / "rayservice.yaml"
CRD = DEPLOY / "kuberay" / "crd" / "ray.io_rayservices.yaml"


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    crd = yaml.load(CRD.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # 1 MB: C parser
    assert crd["spec"]["names"]["kind"] == "RayService"
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return strict(version["schema"]["openAPIV3Schema"])


def strict(schema: Any) -> Any:
    """The schema with undeclared fields refused, where Kubernetes would prune them."""
    if isinstance(schema, dict):
        declared = schema.get("type") == "object" and "properties" in schema
        if declared and "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema = {**schema, "additionalProperties": False}
        return {key: strict(value) for key, value in schema.items()}
    if isinstance(schema, list):
        return [strict(value) for value in schema]
    return schema


def test_it_is_a_valid_rayservice(schema) -> None:
    document = load(RAYSERVICE)
    assert (document["apiVersion"], document["kind"]) == ("ray.io/v1", "RayService")
    jsonschema.validate(document, schema, cls=jsonschema.Draft7Validator)


@pytest.mark.parametrize(
    ("path", "key", "value", "message"),
    [
        (("spec", "rayClusterConfig", "workerGroupSpecs", 0), "replica", 2, "replica"),
        (("spec", "rayClusterConfig", "headGroupSpec"), "rayStartParams", {"num-gpus": 0}, "is not of type 'string'"),
    ],
)
def test_a_misspelt_or_mistyped_field_is_an_error(schema, path, key, value, message) -> None:
    document = copy.deepcopy(load(RAYSERVICE))
    node = document
    for part in path:
        node = node[part]
    node[key] = value
    with pytest.raises(jsonschema.ValidationError, match=message):
        jsonschema.validate(document, schema, cls=jsonschema.Draft7Validator)


def test_its_serve_config_is_the_serve_config_file() -> None:
    assert yaml.safe_load(load(RAYSERVICE)["spec"]["serveConfigV2"]) == load(SERVE_CONFIG)


def test_the_workers_have_a_gpu_each_and_export_metrics() -> None:
    cluster = load(RAYSERVICE)["spec"]["rayClusterConfig"]
    (group,) = cluster["workerGroupSpecs"]
    (container,) = group["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert (
        group["rayStartParams"]["metrics-export-port"]
        == cluster["headGroupSpec"]["rayStartParams"]["metrics-export-port"]
    )


def test_ray_adds_a_gpu_worker_for_every_replica_serve_scales_to() -> None:
    cluster = load(RAYSERVICE)["spec"]["rayClusterConfig"]
    (group,) = cluster["workerGroupSpecs"]
    args = yaml.safe_load(load(RAYSERVICE)["spec"]["serveConfigV2"])["applications"][0]["args"]
    scaling = args["deployment_config"]["autoscaling_config"]
    assert cluster["enableInTreeAutoscaling"] is True
    # One engine per GPU worker: the group's range holds the deployment's.
    assert group["minReplicas"] <= scaling["min_replicas"] and group["maxReplicas"] >= scaling["max_replicas"]
    assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    assert group["replicas"] >= scaling["initial_replicas"]
    # Ray Serve LLM's default target (10^9 ongoing requests a replica) would never scale up.
    engine = args["engine_kwargs"]
    assert 0 < scaling["target_ongoing_requests"] <= engine["max_num_seqs"]


def test_the_workers_read_a_hugging_face_token_if_one_is_given_and_tolerate_the_gpu_taint() -> None:
    (group,) = load(RAYSERVICE)["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    spec = group["template"]["spec"]
    for container in spec["initContainers"] + spec["containers"]:
        (token,) = [e for e in container["env"] if e["name"] == "HF_TOKEN"]
        assert token["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token", "optional": True}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
