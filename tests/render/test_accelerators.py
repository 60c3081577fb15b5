"""GPUs per pod become tensor parallelism; each vendor's resource name, taint and product label."""

from __future__ import annotations

from typing import Any

import pytest

from harness.resources import by_kind
from harness.schemas import validate_manifest
from promptcache.api import InvalidResourceError, parse_resource
from promptcache.controller.checks import gpu_shortfall
from promptcache.render import render
from promptcache.render.model_server import vllm_args


def resource(**model: Any) -> dict[str, Any]:
    return {
        "apiVersion": "serving.promptcache.io/v1alpha1",
        "kind": "PromptCacheDeployment",
        "metadata": {"name": "demo", "namespace": "ns"},
        "spec": {"model": {"name": "org/model", **model}},
    }


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    deployment = by_kind(render(parse_resource(doc)), "Deployment", "model-server")
    validate_manifest(deployment)
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def vllm(spec: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in spec["containers"] if c["name"] == "vllm")


@pytest.mark.parametrize("gpus", [0, 1, 2, 4, 8])
def test_gpus_per_pod_set_tensor_parallelism(gpus: int) -> None:
    args = vllm_args(parse_resource(resource(resources={"gpus": gpus})))
    if gpus > 1:
        i = args.index("--tensor-parallel-size")
        assert args[i + 1] == str(gpus)
    else:
        assert "--tensor-parallel-size" not in args


@pytest.mark.parametrize(
    ("vendor", "resource_name", "label"),
    [
        ("nvidia", "nvidia.com/gpu", "nvidia.com/gpu.product"),
        ("amd", "amd.com/gpu", "amd.com/gpu.product-name"),
    ],
)
def test_each_vendor_gets_its_resource_toleration_and_product_label(
    vendor: str, resource_name: str, label: str
) -> None:
    doc = resource(
        image="registry.example/vllm-rocm:v1",
        resources={"gpus": 2, "gpuVendor": vendor, "gpuProduct": "BIG-GPU"},
        nodeSelector={"pool": "inference"},
        tolerations=[{"key": "dedicated", "operator": "Equal", "value": "llm",
                      "effect": "NoSchedule"}],
    )  # fmt: skip
    spec = pod_spec(doc)
    resources = vllm(spec)["resources"]
    assert resources["limits"][resource_name] == 2
    assert resources["requests"][resource_name] == 2
    other = {"nvidia.com/gpu", "amd.com/gpu"} - {resource_name}
    assert not other & set(resources["limits"])
    assert spec["nodeSelector"] == {label: "BIG-GPU", "pool": "inference"}
    assert spec["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"},
        {"key": resource_name, "operator": "Exists", "effect": "NoSchedule"},
    ]


def test_cpu_pods_get_no_gpu_toleration_and_the_users_selector_wins() -> None:
    spec = pod_spec(resource(resources={"gpus": 0, "gpuProduct": "X"},
                             nodeSelector={"nvidia.com/gpu.product": "Y"}))  # fmt: skip
    assert "tolerations" not in spec
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "Y"}
    assert not any("gpu" in k for k in vllm(spec)["resources"]["limits"])


def test_amd_needs_a_rocm_image() -> None:
    with pytest.raises(InvalidResourceError) as error:
        parse_resource(resource(resources={"gpuVendor": "amd"}))
    (problem,) = error.value.problems
    assert problem.path == "spec.model.image"
    assert problem.message.startswith("AMD GPUs need a ROCm build of vLLM")


def test_the_gpu_check_counts_the_vendors_resource() -> None:
    nodes = [{"metadata": {"labels": {}},
              "status": {"allocatable": {"nvidia.com/gpu": "8", "amd.com/gpu": "2"}}}]  # fmt: skip
    assert gpu_shortfall(nodes, 4, {}, "nvidia.com/gpu") is None
    message = gpu_shortfall(nodes, 4, {}, "amd.com/gpu")
    assert message is not None
    assert "offers 2 amd.com/gpu" in message
