"""`podTemplate` overlays: each kind of override lands in the rendered pod, merged by its
key; the operator's own parts are refused with a message naming the field."""

from __future__ import annotations

import copy
import subprocess
import sys
from typing import Any

import pytest

from harness.pod_template_cases import AFFINITY, KINDS, MOUNT, PODS, VOLUME, resource
from harness.resources import by_kind
from harness.schemas import ROOT, validate_manifest
from promptcache.api import InvalidResourceError, parse_resource
from promptcache.contract import (
    OPERATOR_ANNOTATION_PREFIX,
    OPERATOR_POD_LABELS,
)
from promptcache.render import render


def pod_template(doc: dict[str, Any], component: str) -> dict[str, Any]:
    manifests = render(parse_resource(doc))
    deployment = by_kind(manifests, "Deployment", component)
    validate_manifest(deployment)
    template: dict[str, Any] = deployment["spec"]["template"]
    return template


def refusals(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(InvalidResourceError) as error:
        parse_resource(doc)
    return [str(p) for p in error.value.problems]


@pytest.mark.parametrize("where", PODS)
@pytest.mark.parametrize("kind", KINDS)
def test_each_override_kind_lands_in_the_pod_and_nothing_else_changes(
    where: str, kind: str
) -> None:
    component, _, _ = PODS[where]
    overlay, path, expected = KINDS[kind]
    plain = pod_template(resource(where, {}), component)
    merged = pod_template(resource(where, overlay), component)
    node: Any = merged
    for key in path:
        node = node[key]
    assert node == expected
    # Everything the operator rendered is still there, unchanged.
    if path[0] == "metadata":
        assert plain["metadata"]["labels"].items() <= merged["metadata"]["labels"].items()
    else:
        rest = {k: v for k, v in merged["spec"].items() if k != path[1]}
        assert rest == plain["spec"]


@pytest.mark.parametrize("where", PODS)
def test_volumes_env_and_mounts_merge_into_the_main_container_only(where: str) -> None:
    component, main, _ = PODS[where]
    env = [{"name": "EXTRA", "value": "1"},
           {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]  # fmt: skip
    overlay = {
        "spec": {"volumes": [VOLUME], "containers": [
            {"name": main, "env": env, "volumeMounts": [MOUNT]}]},
    }  # fmt: skip
    plain = pod_template(resource(where, {}), component)
    merged = pod_template(resource(where, overlay), component)
    assert merged["spec"]["volumes"] == [*plain["spec"]["volumes"], VOLUME]
    for before, after in zip(
        plain["spec"]["containers"], merged["spec"]["containers"], strict=True
    ):
        if after["name"] != main:
            assert after == before
            continue
        assert after["env"] == [*before["env"], *env]
        assert after["volumeMounts"] == [*before["volumeMounts"], MOUNT]
        assert {k: v for k, v in after.items() if k not in ("env", "volumeMounts")} == {
            k: v for k, v in before.items() if k not in ("env", "volumeMounts")
        }


def test_overlay_env_replaces_engine_env_of_the_same_name() -> None:
    doc = resource("model", {"spec": {"containers": [
        {"name": "vllm", "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]}]}})  # fmt: skip
    doc["spec"]["engine"] = {"env": [{"name": "VLLM_LOGGING_LEVEL", "value": "INFO"}]}
    vllm = next(c for c in pod_template(doc, "model-server")["spec"]["containers"]
                if c["name"] == "vllm")  # fmt: skip
    assert [e for e in vllm["env"] if e["name"] == "VLLM_LOGGING_LEVEL"] == [
        {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}
    ]


@pytest.mark.parametrize("picker", ["llm-d-router", "promptcache"])
@pytest.mark.parametrize("where", PODS)
def test_the_reserved_names_cover_everything_the_renderer_writes(where: str, picker: str) -> None:
    """The API refuses overlays by these lists; a name the renderer writes but the list
    lacks would let an overlay silently replace it. Both picker pods: with the policy step
    (llm-d-router, sessions on) and alone, mounting the salt key (promptcache, PerKey)."""
    component, main, owned = PODS[where]
    doc = resource(where, {})
    doc["spec"]["model"]["hfTokenSecretRef"] = {"name": "hf"}
    doc["spec"]["gateway"] = {**doc["spec"].get("gateway", {}), "picker": picker}
    if picker == "llm-d-router":
        doc["spec"]["sessionAffinity"] = {"enabled": True}
    template = pod_template(doc, component)
    assert set(template["metadata"]["labels"]) <= set(OPERATOR_POD_LABELS)
    annotations = template["metadata"].get("annotations", {})
    assert all(k.startswith(OPERATOR_ANNOTATION_PREFIX) for k in annotations)
    assert {v["name"] for v in template["spec"]["volumes"]} <= set(owned.volumes)
    names = [c["name"] for c in template["spec"]["containers"]]
    alone = where == "gateway" and picker == "promptcache"
    assert set(names) == ({main} if alone else {main, *owned.other_containers})
    container = next(c for c in template["spec"]["containers"] if c["name"] == main)
    assert {m["mountPath"] for m in container["volumeMounts"]} <= set(owned.mount_paths)
    assert {e["name"] for e in container["env"]} <= set(owned.env)


@pytest.mark.parametrize("where", PODS)
def test_owned_parts_are_refused_with_a_message_naming_the_field(where: str) -> None:
    _, main, owned = PODS[where]
    other = owned.other_containers[0]
    base = f"spec.{where}.podTemplate"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"metadata": {"labels": {"app.kubernetes.io/instance": "x"}}},
         f"{base}.metadata.labels: labels app.kubernetes.io/name"),
        ({"metadata": {"annotations": {"serving.promptcache.io/epp-config-sha256": "x"}}},
         f"{base}.metadata.annotations: annotations under serving.promptcache.io/"),
        ({"spec": {"containers": [{"name": other, "env": [{"name": "A", "value": "1"}]}]}},
         f"{base}.spec.containers: only the {main} container can be extended"),
        ({"spec": {"volumes": [{"name": owned.volumes[0], "emptyDir": {}}]}},
         f"{base}.spec.volumes: volume names {owned.volumes[0]}"),
        ({"spec": {"containers": [{"name": main, "volumeMounts": [
            {"name": "missing", "mountPath": "/x"}]}]}},
         f"{base}.spec.containers: each volumeMount must name a volume"),
        ({"spec": {"containers": [{"name": main, "env": [{"name": owned.env[0], "value": "x"}]}]}},
         f"{base}.spec.containers[0].env: env {owned.env[0]}"),
        ({"spec": {"containers": [{"name": main, "volumeMounts": [
            {"name": owned.volumes[0], "mountPath": owned.mount_paths[0]}]}]}},
         f"{base}.spec.containers[0].volumeMounts: mount paths {owned.mount_paths[0]}"),
    ]  # fmt: skip
    for field in ("command", "args", "image", "ports", "livenessProbe", "readinessProbe",
                  "startupProbe", "resources", "securityContext"):  # fmt: skip
        cases.append(
            (
                {"spec": {"containers": [{"name": main, field: [1]}]}},
                f"{base}.spec.containers[0].{field}: {field} of the {main} container cannot be "
                "overridden",
            )
        )
    for overlay, expected in cases:
        problems = refusals(resource(where, overlay))
        assert len(problems) == 1, problems
        assert problems[0].startswith(expected), (problems, expected)


def test_kubernetes_types_are_checked_by_their_own_schema() -> None:
    bad = copy.deepcopy(AFFINITY)
    term = bad["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    term["nodeSelectorTerms"][0]["matchExpressions"][0] = {"key": "pool", "operatr": "In"}
    problems = refusals(resource("model", {"spec": {"affinity": bad, "volumes": [{"nam": 1}]}}))
    where = ("spec.model.podTemplate.spec.affinity.nodeAffinity."
             "requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
             ".matchExpressions[0]")  # fmt: skip
    assert problems == [
        f"{where}.operatr: unknown field",
        f"{where}.operator: required field is missing",
        "spec.model.podTemplate.spec.volumes[0].nam: unknown field",
        "spec.model.podTemplate.spec.volumes[0].name: required field is missing",
    ]


def test_the_kubernetes_schemas_are_fresh() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "k8s_schemas.py"), "--check"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
