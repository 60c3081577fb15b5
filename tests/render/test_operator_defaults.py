"""Operator-wide defaults: a resource without image fields gets the operator's images.

The same OperatorDefaults reach the renderer from `promptcache run` (the chart's
`defaultImages` values become its flags) and from `promptcache render` (the same flags);
a resource's own image always wins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from harness.cli import run_cli
from harness.resource_strategies import resources
from promptcache.api import BUILT_IN_DEFAULTS, OperatorDefaults, parse_resource
from promptcache.api.constants import DEFAULT_FRONT_IMAGE, DEFAULT_GATEWAY_POLICY_IMAGE
from promptcache.render import render
from promptcache.render.epp import GATEWAY_POLICY_CONTAINER
from promptcache.render.front import FRONT_CONTAINER

ROOT = Path(__file__).resolve().parents[2]


def resource(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "serving.promptcache.io/v1alpha1",
        "kind": "PromptCacheDeployment",
        "metadata": {"name": "m", "namespace": "team"},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
            # useUserField (the default) puts the gateway policy step into the pod of
            # llm-d-router (promptcache's own picker, the default, has no step).
            "sessionAffinity": {"enabled": True},
            "gateway": {"picker": "llm-d-router"},
            **spec,
        },
    }


def images(manifests: list[dict[str, Any]]) -> dict[str, str]:
    """Container name -> image over every Deployment."""
    return {
        c["name"]: c["image"]
        for m in manifests
        if m["kind"] == "Deployment"
        for c in m["spec"]["template"]["spec"]["containers"]
    }


def test_a_resource_without_image_fields_gets_the_built_in_images_of_this_release() -> None:
    got = images(render(parse_resource(resource())))
    assert got[FRONT_CONTAINER] == DEFAULT_FRONT_IMAGE
    assert got[GATEWAY_POLICY_CONTAINER] == DEFAULT_GATEWAY_POLICY_IMAGE
    assert OperatorDefaults() == BUILT_IN_DEFAULTS


def test_a_resource_without_image_fields_gets_the_operators_defaults() -> None:
    defaults = OperatorDefaults(
        front_image="mirror.example/pc/front:9.9.9", gateway_policy_image="mirror.example/pc/op:9"
    )
    got = images(render(parse_resource(resource()), defaults))
    assert got[FRONT_CONTAINER] == "mirror.example/pc/front:9.9.9"
    assert got[GATEWAY_POLICY_CONTAINER] == "mirror.example/pc/op:9"


@given(
    own_front=st.none() | st.just("own.example/front:1"),
    own_shim=st.none() | st.just("own.example/shim:1"),
    default_front=st.sampled_from(["a.example/f:1", DEFAULT_FRONT_IMAGE]),
    default_shim=st.sampled_from(["a.example/s@sha256:" + "a" * 64, DEFAULT_GATEWAY_POLICY_IMAGE]),
)
def test_the_resources_own_image_wins_over_any_default(
    own_front: str | None, own_shim: str | None, default_front: str, default_shim: str
) -> None:
    spec: dict[str, Any] = {}
    if own_front:
        spec["front"] = {"image": own_front}
    if own_shim:
        spec["gateway"] = {"picker": "llm-d-router", "gatewayPolicyImage": own_shim}
    defaults = OperatorDefaults(front_image=default_front, gateway_policy_image=default_shim)
    got = images(render(parse_resource(resource(**spec)), defaults))
    assert got[FRONT_CONTAINER] == (own_front or default_front)
    assert got[GATEWAY_POLICY_CONTAINER] == (own_shim or default_shim)


def test_the_crd_does_not_freeze_a_default_image_into_stored_resources() -> None:
    """An API-server default would be stored in every resource and shadow the operator's."""
    crd = yaml.safe_load(
        (ROOT / "crds" / "serving.promptcache.io_promptcachedeployments.yaml").read_text()
    )
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    front = spec["properties"]["front"]
    gateway = spec["properties"]["gateway"]
    assert "default" not in front["properties"]["image"]
    assert "default" not in gateway["properties"]["gatewayPolicyImage"]
    assert "image" not in front["default"]
    assert "gatewayPolicyImage" not in gateway["default"]


def test_render_takes_the_same_defaults_from_flags(tmp_path: Path) -> None:
    source = tmp_path / "pcd.yaml"
    source.write_text(yaml.safe_dump(resource()))
    result = run_cli(
        "render",
        "-f",
        str(source),
        "--front-image",
        "mirror.example/front:2",
        "--gateway-policy-image",
        "mirror.example/operator:2",
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    got = images([d for d in yaml.safe_load_all(result.stdout) if d])
    assert got[FRONT_CONTAINER] == "mirror.example/front:2"
    assert got[GATEWAY_POLICY_CONTAINER] == "mirror.example/operator:2"


@pytest.mark.parametrize("command", ["render", "run"])
def test_a_bad_default_image_flag_is_refused_naming_the_flag(command: str, tmp_path: Path) -> None:
    source = tmp_path / "pcd.yaml"
    source.write_text(yaml.safe_dump(resource()))
    where = ["-f", str(source)] if command == "render" else ["--all-namespaces"]
    result = run_cli(command, *where, "--front-image", "has space:1", cwd=ROOT)
    assert result.returncode == 2
    assert "--front-image:" in result.stderr
    assert "'has space:1'" in result.stderr
    assert "Traceback" not in result.stderr


@given(
    doc=resources(),
    uid=st.none() | st.integers(min_value=1, max_value=2**31 - 1),
)
def test_every_rendered_pod_is_hardened_and_fixes_a_uid_only_for_vllm(
    doc: dict[str, Any], uid: int | None
) -> None:
    """The Pod Security "restricted" settings, plus a read-only root everywhere. (The API
    server's own admission checks the same pods in e2e/test_pod_security.py.)"""
    defaults = OperatorDefaults(model_server_user=uid)
    for m in render(parse_resource(doc), defaults):
        if m["kind"] != "Deployment":
            continue
        pod = m["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert "runAsUser" not in pod["securityContext"]
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc.get("runAsUser") == (uid if c["name"] == "vllm" else None)
        assert pod["securityContext"].get("fsGroup") == (
            uid if any(c["name"] == "vllm" for c in pod["containers"]) else None
        )
        for volume in pod.get("volumes", []):
            assert volume.keys() & {"emptyDir", "configMap", "secret", "persistentVolumeClaim"}
