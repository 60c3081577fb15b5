"""The Endpoint Picker pod with and without the session shim (spec/004's `user` field).

With session affinity and `useUserField`, the gateway must reach the shim (which copies
`user` into the session header) and the shim the EPP; otherwise the pod is as before.
The wiring is checked through the shim's own command-line parser, so the renderer and
`promptcache session-shim` cannot drift apart.
"""

from __future__ import annotations

import argparse
import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from promptcache._version import __version__
from promptcache.api import parse_resource
from promptcache.contract import EPP_EXT_PROC_PORT, SessionShimEnv
from promptcache.gateway.command import settings_from
from promptcache.gateway.settings import ShimSettings
from promptcache.render import render
from tests.render.schemas import validate_manifest
from tests.render.strategies import resources

BASE: dict[str, Any] = {
    "apiVersion": "serving.promptcache.io/v1alpha1",
    "kind": "PromptCacheDeployment",
    "metadata": {"name": "chat", "namespace": "serving"},
    "spec": {"model": {"name": "org/model", "replicas": 2}},
}


def rendered(**spec: Any) -> list[dict[str, Any]]:
    doc = copy.deepcopy(BASE)
    doc["spec"].update(spec)
    return render(parse_resource(doc))


def epp_deployment(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    (dep,) = [
        m for m in manifests if m["kind"] == "Deployment" and m["metadata"]["name"].endswith("-epp")
    ]
    return dep


def containers(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    pod = epp_deployment(manifests)["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["containers"]}


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def shim_settings(container: dict[str, Any]) -> ShimSettings:
    """What `promptcache session-shim` makes of the rendered container (args are the CLI's)."""
    assert container["args"] == ["session-shim"]
    return settings_from(argparse.Namespace(), env_of(container))


def grpc_target(manifests: list[dict[str, Any]]) -> tuple[str, int]:
    """The container and port the Service's `grpc` target port resolves to."""
    (service,) = [
        m for m in manifests if m["kind"] == "Service" and m["metadata"]["name"].endswith("-epp")
    ]
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == EPP_EXT_PROC_PORT]
    found = [
        (name, p["containerPort"])
        for name, c in containers(manifests).items()
        for p in c.get("ports", [])
        if p["name"] == port["targetPort"]
    ]
    assert len(found) == 1, found  # a named port must be unique in the pod
    return found[0]


def test_user_field_puts_the_shim_in_front_of_the_epp() -> None:
    manifests = rendered(sessionAffinity={"enabled": True, "header": "x-conversation"})
    pods = containers(manifests)
    assert list(pods) == ["epp", "session-shim"]
    epp, shim = pods["epp"], pods["session-shim"]
    epp_port = int(flag(epp["args"], "--grpc-port"))
    assert epp_port != EPP_EXT_PROC_PORT
    assert "grpc" not in {p["name"] for p in epp["ports"]}
    settings = shim_settings(shim)
    assert settings.upstream == f"127.0.0.1:{epp_port}"
    assert settings.listen == f"0.0.0.0:{EPP_EXT_PROC_PORT}"
    assert settings.session_header == "x-conversation"
    assert settings.user_field == "user"
    assert grpc_target(manifests) == ("session-shim", EPP_EXT_PROC_PORT)
    assert shim["image"] == f"ghcr.io/promptcache/promptcache-operator:{__version__}"
    assert shim["securityContext"]["readOnlyRootFilesystem"] is True
    assert shim["securityContext"]["runAsNonRoot"] is True
    assert shim["readinessProbe"]["tcpSocket"] == {"port": "grpc"}
    assert shim["livenessProbe"]["tcpSocket"] == {"port": "grpc"}
    # The memory limit covers every body the shim may hold, plus its runtime.
    limit_mib = int(shim["resources"]["limits"]["memory"].removesuffix("Mi"))
    assert limit_mib * 1024**2 >= settings.max_buffered_bytes + 64 * 1024**2
    assert (
        0
        < settings.drain_seconds
        < epp_deployment(manifests)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    )
    validate_manifest(epp_deployment(manifests))


def test_the_image_can_be_chosen() -> None:
    manifests = rendered(
        sessionAffinity={"enabled": True},
        gateway={"sessionShimImage": "registry.example/promptcache-operator@sha256:" + "a" * 64},
    )
    assert containers(manifests)["session-shim"]["image"].startswith("registry.example/")


def test_without_user_field_or_sessions_the_pod_is_unchanged() -> None:
    plain = rendered()
    for spec in (
        {"sessionAffinity": {"enabled": True, "useUserField": False}},
        {"sessionAffinity": {"enabled": False, "useUserField": True}},
    ):
        manifests = rendered(**spec)
        pods = containers(manifests)
        assert list(pods) == ["epp"]
        assert int(flag(pods["epp"]["args"], "--grpc-port")) == EPP_EXT_PROC_PORT
        assert grpc_target(manifests) == ("epp", EPP_EXT_PROC_PORT)
        assert pods["epp"]["ports"] == containers(plain)["epp"]["ports"]


def test_shim_env_names_are_the_contracts() -> None:
    manifests = rendered(sessionAffinity={"enabled": True})
    names = set(env_of(containers(manifests)["session-shim"]))
    declared = {v for k, v in vars(SessionShimEnv).items() if k.isupper()}
    assert names == declared


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(resources(), st.booleans())
def test_the_gateway_always_reaches_one_ext_proc_port(doc: dict[str, Any], user: bool) -> None:
    doc["spec"]["sessionAffinity"]["useUserField"] = user
    manifests = render(parse_resource(doc))
    pods = containers(manifests)
    shim = doc["spec"]["sessionAffinity"]["enabled"] and user
    target = grpc_target(manifests)
    epp_port = int(flag(pods["epp"]["args"], "--grpc-port"))
    if shim:
        assert target == ("session-shim", EPP_EXT_PROC_PORT)
        assert shim_settings(pods["session-shim"]).upstream == f"127.0.0.1:{epp_port}"
    else:
        assert target == ("epp", epp_port)
        assert "session-shim" not in pods
