"""The Endpoint Picker pod with and without the gateway's policy step.

In front of `llm-d-router` and `gie-v1.5`, when isolation derives salts or sessions are
on, the gateway must reach the policy step (tenant salt, sessions from the body, Required
refusals) and the step the picker, over the pod's loopback in plain gRPC; otherwise, and
always with `promptcache` (the default), the picker is alone on the Service's port. The
wiring is checked through the step's own command-line parser, so the renderer and
`promptcache gateway-policy` cannot drift apart.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.resource_strategies import resources
from harness.resources import (
    env_of,
    epp_containers,
    epp_deployment,
    gateway_policy_settings,
)
from harness.resources import rendered as rendered_default
from harness.schemas import validate_manifest
from promptcache._version import __version__
from promptcache.api import parse_resource
from promptcache.contract import EPP_EXT_PROC_PORT, FrontEnv, GatewayPolicyEnv, IsolationMode
from promptcache.contract.front import DEFAULT_FAIR_SHARE_BYTES_PER_SECOND
from promptcache.render import render, resolved
from promptcache.render.epp import CONFIG_HASH_ANNOTATION


def rendered(**spec: Any) -> list[dict[str, Any]]:
    """The manifests with `llm-d-router` named: the step fronts only the pickers that do
    not derive the salt themselves (`promptcache`, the default, never has one)."""
    gateway = {"picker": "llm-d-router", **spec.pop("gateway", {})}
    return rendered_default(gateway=gateway, **spec)


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def grpc_target(manifests: list[dict[str, Any]]) -> tuple[str, int]:
    """The container and port the Service's `grpc` target port resolves to."""
    (service,) = [
        m for m in manifests if m["kind"] == "Service" and m["metadata"]["name"].endswith("-epp")
    ]
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == EPP_EXT_PROC_PORT]
    found = [
        (name, p["containerPort"])
        for name, c in epp_containers(manifests).items()
        for p in c.get("ports", [])
        if p["name"] == port["targetPort"]
    ]
    assert len(found) == 1, found  # a named port must be unique in the pod
    return found[0]


def test_the_policy_step_fronts_the_picker() -> None:
    manifests = rendered(sessionAffinity={"enabled": True, "header": "x-conversation"})
    pods = epp_containers(manifests)
    assert list(pods) == ["epp", "gateway-policy"]
    epp, shim = pods["epp"], pods["gateway-policy"]
    epp_port = int(flag(epp["args"], "--grpc-port"))
    assert epp_port != EPP_EXT_PROC_PORT
    assert "grpc" not in {p["name"] for p in epp["ports"]}
    # Transport as rendered: the step dials plain gRPC over loopback, so the picker must
    # not serve TLS there.
    assert "--secure-serving=false" in epp["args"]
    settings = gateway_policy_settings(shim)
    assert settings.upstream == f"127.0.0.1:{epp_port}"
    assert settings.listen == f"0.0.0.0:{EPP_EXT_PROC_PORT}"
    assert settings.session_header == "x-conversation"
    assert settings.user_field == "user"
    assert settings.isolation_mode is IsolationMode.PER_KEY
    assert grpc_target(manifests) == ("gateway-policy", EPP_EXT_PROC_PORT)
    assert shim["image"] == f"ghcr.io/promptcache/promptcache-operator:{__version__}"
    assert shim["securityContext"]["readOnlyRootFilesystem"] is True
    assert shim["securityContext"]["runAsNonRoot"] is True
    assert shim["readinessProbe"]["tcpSocket"] == {"port": "grpc"}
    assert shim["livenessProbe"]["tcpSocket"] == {"port": "grpc"}
    # It refuses with 413 exactly what the front would.
    model = next(
        m for m in manifests if m["kind"] == "Deployment" and m is not epp_deployment(manifests)
    )
    front = next(c for c in model["spec"]["template"]["spec"]["containers"] if c["name"] != "vllm")
    assert settings.max_body_bytes == int(env_of(front)[FrontEnv.MAX_BODY_BYTES])
    # The memory limit covers every body the step may hold, plus its runtime.
    limit_mib = int(shim["resources"]["limits"]["memory"].removesuffix("Mi"))
    assert limit_mib * 1024**2 >= settings.max_buffered_bytes + 64 * 1024**2
    assert (
        0
        < settings.drain_seconds
        < epp_deployment(manifests)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    )
    validate_manifest(epp_deployment(manifests))


def test_the_step_reads_the_fronts_salt_secret_and_settings() -> None:
    manifests = rendered(isolation={"mode": "Required", "header": "x-tenant"})
    epp_pod = epp_deployment(manifests)["spec"]["template"]["spec"]
    model = next(
        m for m in manifests if m["kind"] == "Deployment" and m is not epp_deployment(manifests)
    )
    model_pod = model["spec"]["template"]["spec"]
    (salt,) = [v for v in epp_pod["volumes"] if "secret" in v]
    assert salt in model_pod["volumes"]  # the very Secret (and key) the front mounts
    shim = epp_containers(manifests)["gateway-policy"]
    front = next(c for c in model_pod["containers"] if c["name"] != "vllm")
    front_env, gateway_policy_env = env_of(front), env_of(shim)
    for name in (
        FrontEnv.ISOLATION_MODE,
        FrontEnv.ISOLATION_HEADER,
        FrontEnv.ISOLATION_FIELD,
        FrontEnv.HONOR_MAX_LEN,
        FrontEnv.SALT_KEY_FILE,
    ):
        assert gateway_policy_env[name] == front_env[name], name
    (mount,) = shim["volumeMounts"]
    assert mount["name"] == salt["name"]
    assert gateway_policy_env[FrontEnv.SALT_KEY_FILE].startswith(mount["mountPath"] + "/")
    settings = gateway_policy_settings(shim)
    assert settings.isolation_mode is IsolationMode.REQUIRED
    assert settings.session_header == ""  # sessions are off: the step names none


@pytest.mark.parametrize("allowed", [False, True])
def test_the_step_refuses_engine_state_fields_as_the_front_does(allowed: bool) -> None:
    """`spec.front.allowEngineState` reaches both processes, so a field the front would
    refuse is refused before routing too."""
    manifests = rendered(front={"allowEngineState": allowed})
    model = next(
        m for m in manifests if m["kind"] == "Deployment" and m is not epp_deployment(manifests)
    )
    front = next(c for c in model["spec"]["template"]["spec"]["containers"] if c["name"] != "vllm")
    step = epp_containers(manifests)["gateway-policy"]
    assert env_of(front)[FrontEnv.ALLOW_ENGINE_STATE] == ("true" if allowed else "false")
    assert env_of(step)[FrontEnv.ALLOW_ENGINE_STATE] == env_of(front)[FrontEnv.ALLOW_ENGINE_STATE]
    assert gateway_policy_settings(step).allow_engine_state is allowed


@pytest.mark.parametrize("rate", [None, 0, 1 << 20])
def test_each_keys_fair_share_reaches_both_processes_alike(rate: int | None) -> None:
    """`spec.front.fairShareBytesPerSecond` meters a key in the front and in the step with
    the same rate (0 turns both off); unset, both get the contract's default."""
    manifests = rendered(front={} if rate is None else {"fairShareBytesPerSecond": rate})
    model = next(
        m for m in manifests if m["kind"] == "Deployment" and m is not epp_deployment(manifests)
    )
    front = next(c for c in model["spec"]["template"]["spec"]["containers"] if c["name"] != "vllm")
    step = epp_containers(manifests)["gateway-policy"]
    expected = DEFAULT_FAIR_SHARE_BYTES_PER_SECOND if rate is None else rate
    assert env_of(front)[FrontEnv.FAIR_SHARE_BYTES_PER_SECOND] == str(expected)
    assert gateway_policy_settings(step).fair_share_bytes_per_second == expected


def test_isolation_by_account_reaches_both_processes_alike() -> None:
    """`spec.isolation.identity` is rendered into the front and the step with the same
    values, so both derive one account's salt and refuse alike; off, nothing is rendered."""
    identity = {"header": "x-account-id", "bearerToken": True, "required": True}
    manifests = rendered(isolation={"identity": identity})
    model = next(
        m for m in manifests if m["kind"] == "Deployment" and m is not epp_deployment(manifests)
    )
    front = next(c for c in model["spec"]["template"]["spec"]["containers"] if c["name"] != "vllm")
    step = epp_containers(manifests)["gateway-policy"]
    names = (FrontEnv.IDENTITY_HEADER, FrontEnv.IDENTITY_BEARER, FrontEnv.IDENTITY_REQUIRED)
    assert [env_of(front)[n] for n in names] == ["x-account-id", "true", "true"]
    assert [env_of(step)[n] for n in names] == [env_of(front)[n] for n in names]
    settings = gateway_policy_settings(step)
    assert (settings.identity_header, settings.identity_bearer, settings.identity_required) == (
        "x-account-id",
        True,
        True,
    )
    plain = epp_containers(rendered())["gateway-policy"]
    assert not set(names) & set(env_of(plain))


def test_the_image_can_be_chosen() -> None:
    manifests = rendered(
        sessionAffinity={"enabled": True},
        gateway={"gatewayPolicyImage": "registry.example/promptcache-operator@sha256:" + "a" * 64},
    )
    assert epp_containers(manifests)["gateway-policy"]["image"].startswith("registry.example/")


def test_shared_without_sessions_keeps_the_picker_alone_on_tls() -> None:
    manifests = rendered(isolation={"mode": "Shared"})
    pods = epp_containers(manifests)
    assert list(pods) == ["epp"]
    assert int(flag(pods["epp"]["args"], "--grpc-port")) == EPP_EXT_PROC_PORT
    assert grpc_target(manifests) == ("epp", EPP_EXT_PROC_PORT)
    assert "--secure-serving=false" not in pods["epp"]["args"]
    # Sessions (prompt_cache_key names them even without `user`), or salts: the step.
    with_sessions = {"enabled": True, "useUserField": False}
    assert "gateway-policy" in epp_containers(
        rendered(isolation={"mode": "Shared"}, sessionAffinity=with_sessions)
    )
    assert "gateway-policy" in epp_containers(rendered(isolation={"mode": "PerKey"}))


def test_shim_env_names_are_the_contracts() -> None:
    manifests = rendered(
        sessionAffinity={"enabled": True}, isolation={"identity": {"bearerToken": True}}
    )
    names = set(env_of(epp_containers(manifests)["gateway-policy"]))
    declared = {v for k, v in vars(GatewayPolicyEnv).items() if k.isupper()}
    assert names == declared


def test_a_config_change_rolls_the_picker() -> None:
    """The picker reads its config once: the pod template carries the config's hash."""

    def annotation(**spec: Any) -> str:
        template = epp_deployment(rendered(**spec))["spec"]["template"]
        return str(template["metadata"]["annotations"][CONFIG_HASH_ANNOTATION])

    base = annotation()
    assert base == annotation()
    assert annotation(prefixCache={"weights": {"queue": 2.5}}) != base
    assert annotation(gateway={"picker": "gie-v1.5"}) != base
    assert annotation(model={"name": "org/model", "replicas": 5}) == base  # not the config


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(resources(), st.booleans())
def test_the_gateway_always_reaches_one_ext_proc_port(doc: dict[str, Any], user: bool) -> None:
    doc["spec"]["sessionAffinity"]["useUserField"] = user
    pcd = resolved(parse_resource(doc))
    manifests = render(pcd)
    pods = epp_containers(manifests)
    step = pcd.spec.gateway.picker != "promptcache" and (
        pcd.spec.isolation.mode != "Shared" or pcd.spec.session_affinity.enabled
    )
    target = grpc_target(manifests)
    epp_port = int(flag(pods["epp"]["args"], "--grpc-port"))
    if step:
        assert target == ("gateway-policy", EPP_EXT_PROC_PORT)
        assert gateway_policy_settings(pods["gateway-policy"]).upstream == f"127.0.0.1:{epp_port}"
        assert "--secure-serving=false" in pods["epp"]["args"]
    else:
        assert target == ("epp", epp_port)
        assert "gateway-policy" not in pods
        assert "--secure-serving=false" not in pods["epp"]["args"]
