"""Every pod this project creates is admitted under the Pod Security "restricted" profile.

The check is the API server's own PodSecurity admission on a namespace labelled
`pod-security.kubernetes.io/enforce: restricted`: each rendered Deployment is created
there for real and its ReplicaSet must create its pods (a rejected pod never exists, and
the ReplicaSet says `ReplicaFailure`), for every example and the shapes the renderer
knows (with and without the gateway policy step, without the front, an HA picker, a model-cache
claim, no fixed UID). The chart's operator pod goes through the same admission. A pod
missing one of the profile's settings is refused by the same namespace, so the namespace
does enforce.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.pytest_cluster import Cluster
from promptcache.render.epp import GATEWAY_POLICY_CONTAINER
from promptcache.render.front import FRONT_CONTAINER

pytestmark = [pytest.mark.cluster]

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "promptcache-operator"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}

# Shapes beyond the examples: name -> spec overrides of a tiny resource.
SHAPES: dict[str, dict[str, Any]] = {
    "picker-with-session-shim": {
        "sessionAffinity": {"enabled": True, "useUserField": True},
        "gateway": {"picker": "llm-d-router"},
    },
    "picker-alone": {
        "sessionAffinity": {"enabled": True, "useUserField": False},
        "isolation": {"mode": "Shared"},
        "gateway": {"picker": "llm-d-router"},
    },
    "default-picker-reading-the-salt-key": {"isolation": {"mode": "PerKey"}},
    "ha-picker": {"gateway": {"replicas": 2}},
    "no-front": {
        "front": {"enabled": False, "usageHeaders": {"enabled": False}},
        "isolation": {"mode": "Shared"},
    },
    "embeds-and-model-cache-claim": {
        "promptEmbeds": {"enabled": True},
        "model": {"modelCache": {"claimName": "weights"}},
    },
}


def tiny(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    model = {"name": "Qwen/Qwen2.5-0.5B-Instruct", "resources": {"gpus": 0}}
    model.update(spec.pop("model", {}))
    return {
        "apiVersion": "serving.promptcache.io/v1alpha1",
        "kind": "PromptCacheDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"model": model, **spec},
    }


def render(resources: list[dict[str, Any]], *flags: str) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "promptcache.cli", "render", "-f", "-", *flags],
        input=yaml.safe_dump_all(resources),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@pytest.fixture
def restricted(cluster: Cluster) -> Iterator[str]:
    name = cluster.create_namespace("psa")
    cluster.kubectl("label", "namespace", name, *(f"{k}={v}" for k, v in RESTRICTED.items()))
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def admitted(cluster: Cluster, namespace: str, pod_spec: dict[str, Any], name: str) -> str:
    """'' when a server-side dry-run create of the pod passes admission, else the error."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": pod_spec,
    }
    proc = cluster.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False
    )
    return "" if proc.returncode == 0 else proc.stderr


def test_the_namespace_enforces_the_restricted_profile(cluster: Cluster, restricted: str) -> None:
    """The control: the same namespace refuses a pod that drops one restricted setting."""
    container = {
        "name": "c",
        "image": "example.invalid/c:1",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    ok = {
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
    }
    assert admitted(cluster, restricted, ok, "ok") == ""
    no_seccomp = {"containers": [container]}
    error = admitted(cluster, restricted, no_seccomp, "no-seccomp")
    assert 'violates PodSecurity "restricted:latest"' in error
    assert "seccompProfile" in error


def _shapes(namespace: str) -> list[dict[str, Any]]:
    resources = [tiny(name, namespace, **spec) for name, spec in SHAPES.items()]
    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                doc["metadata"]["namespace"] = namespace
                doc["metadata"]["name"] = f"ex-{doc['metadata']['name']}"
                resources.append(doc)
    return resources


@pytest.mark.parametrize("flags", [(), ("--model-server-user", "none")], ids=["default", "no-uid"])
def test_every_rendered_pod_is_admitted_as_restricted(
    cluster: Cluster, restricted: str, flags: tuple[str, ...]
) -> None:
    manifests = render(_shapes(restricted), *flags)
    deployments = [m for m in manifests if m["kind"] == "Deployment"]
    # Every shape renders its model servers and its picker; the shim shape has two containers.
    assert len(deployments) == 2 * (len(SHAPES) + sum(1 for _ in EXAMPLES))
    containers = {
        c["name"] for d in deployments for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert {"vllm", FRONT_CONTAINER, "epp", GATEWAY_POLICY_CONTAINER} <= containers
    for d in deployments:
        for c in d["spec"]["template"]["spec"]["containers"]:
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, (
                d["metadata"],
                c["name"],
            )
        uids = {
            c["securityContext"].get("runAsUser")
            for c in d["spec"]["template"]["spec"]["containers"]
            if c["name"] != "vllm"
        }
        assert uids <= {None}, "only vLLM's container, whose image has no user, gets a UID"
    # What the examples' pods name must exist for the pods to be created at all.
    for priority in {
        d["spec"]["template"]["spec"].get("priorityClassName") for d in deployments
    } - {None}:
        cluster.kubectl("create", "priorityclass", priority, "--value=1000", check=False)
    # The rest of the render (ServiceAccounts, RBAC, ConfigMaps, Services) first, for real.
    others = [m for m in manifests if m["kind"] not in ("Deployment", "InferencePool", "HTTPRoute")]
    cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(others))
    cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(deployments))

    def pods_of(deployment: str) -> int:
        selector = ",".join(
            f"{k}={v}"
            for k, v in next(d for d in deployments if d["metadata"]["name"] == deployment)["spec"][
                "selector"
            ]["matchLabels"].items()
        )
        pods = cluster.get_json("pods", "-n", restricted, "-l", selector)["items"]
        return len(pods)

    for d in deployments:
        name = d["metadata"]["name"]
        want = d["spec"]["replicas"]
        if want == 0:
            continue
        try:
            cluster.wait_for(lambda n=name, w=want: pods_of(n) >= w, f"pods of {name}", 120)
        except AssertionError:
            sets = cluster.get_json("replicasets", "-n", restricted)["items"]
            conditions = [s.get("status", {}).get("conditions") for s in sets]
            raise AssertionError(
                f"{name}: pods not created; ReplicaSets say {conditions}"
            ) from None
    sets = cluster.get_json("replicasets", "-n", restricted)["items"]
    failures = [
        (s["metadata"]["name"], c.get("message"))
        for s in sets
        for c in s.get("status", {}).get("conditions", [])
        if c["type"] == "ReplicaFailure"
    ]
    assert failures == []


@pytest.mark.helm
@pytest.mark.parametrize("values", [(), ("--set", "replicas=2")], ids=["default", "ha"])
def test_the_charts_operator_pod_is_admitted_as_restricted(
    cluster: Cluster, restricted: str, values: tuple[str, ...]
) -> None:
    rendered = cluster.helm("template", "pco", str(CHART), "-n", restricted, *values).stdout
    deployments = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment"]
    assert len(deployments) == 1
    (deployment,) = deployments
    spec = deployment["spec"]["template"]["spec"]
    cluster.kubectl("create", "serviceaccount", spec["serviceAccountName"], "-n", restricted)
    (container,) = spec["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert "runAsUser" not in spec["securityContext"]
    assert admitted(cluster, restricted, spec, deployment["metadata"]["name"]) == ""
