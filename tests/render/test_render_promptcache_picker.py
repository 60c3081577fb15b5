"""`gateway.picker: promptcache`: promptcache's own picker build derives the tenant salt
itself, so its pod is the picker alone (no policy step), reading the front's salt Secret,
with its tenant-salt parser selected by `parser.pluginRef` and given the very isolation
settings the cache front gets (picker/README.md)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from harness.resources import rendered
from promptcache._version import __version__
from promptcache.contract import (
    EPP_EXT_PROC_PORT,
    PREDICTED_MATCH_PLUGIN,
    PROFILES,
    SALT_KEY_FILE,
    SALT_KEY_MOUNT_DIR,
    TENANT_SALT_PARSER,
    FrontEnv,
    PickerFlag,
    PickerTarget,
    TenantSaltParam,
    lacking,
)
from promptcache.contract import PickerFeature as Feature
from promptcache.render.epp import GATEWAY_POLICY_CONTAINER
from promptcache.render.epp_config import PREFIX_PRODUCER

OURS = {"picker": "promptcache"}


def epp_pod(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    (dep,) = [
        m for m in manifests if m["kind"] == "Deployment" and m["metadata"]["name"].endswith("-epp")
    ]
    pod: dict[str, Any] = dep["spec"]["template"]["spec"]
    return pod


def config(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    (cm,) = [
        m for m in manifests if m["kind"] == "ConfigMap" and m["metadata"]["name"].endswith("-epp")
    ]
    doc: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return doc


def front_env(manifests: list[dict[str, Any]]) -> dict[str, str]:
    (model,) = [
        m
        for m in manifests
        if m["kind"] == "Deployment" and not m["metadata"]["name"].endswith("-epp")
    ]
    (front,) = [c for c in model["spec"]["template"]["spec"]["containers"] if c["name"] != "vllm"]
    return {e["name"]: e["value"] for e in front["env"] if "value" in e}


def parser_parameters(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    doc = config(manifests)
    assert doc["parser"] == {"pluginRef": TENANT_SALT_PARSER}
    (plugin,) = [p for p in doc["plugins"] if p["type"] == TENANT_SALT_PARSER]
    params: dict[str, Any] = plugin["parameters"]
    return params


def as_env(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


ISOLATIONS = [
    {"mode": "Shared"},
    {"mode": "PerKey"},
    {"mode": "PerKey", "header": "", "bodyField": "tenant"},
    {"mode": "Required", "header": "x-tenant", "bodyField": ""},
    {"mode": "PerKey", "identity": {"header": "x-account-id", "bearerToken": True}},
    {"mode": "Required", "identity": {"bearerToken": True, "required": True}},
]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_parser_gets_the_fronts_isolation_settings(isolation: dict[str, Any]) -> None:
    manifests = rendered(gateway=OURS, isolation=isolation)
    params = parser_parameters(manifests)
    env = front_env(manifests)
    assert set(params) <= {p.value for p in TenantSaltParam}  # the parser decodes strictly
    same = {
        TenantSaltParam.ISOLATION_MODE: FrontEnv.ISOLATION_MODE,
        TenantSaltParam.ISOLATION_HEADER: FrontEnv.ISOLATION_HEADER,
        TenantSaltParam.ISOLATION_FIELD: FrontEnv.ISOLATION_FIELD,
        TenantSaltParam.HONOR_MAX_LEN: FrontEnv.HONOR_MAX_LEN,
        TenantSaltParam.ALLOW_CLIENT_PRIORITY: FrontEnv.ALLOW_CLIENT_PRIORITY,
        TenantSaltParam.ALLOW_ENGINE_STATE: FrontEnv.ALLOW_ENGINE_STATE,
    }
    for param, var in same.items():
        assert as_env(params[param]) == env[var], param
    identity = (
        TenantSaltParam.IDENTITY_HEADER,
        TenantSaltParam.IDENTITY_BEARER,
        TenantSaltParam.IDENTITY_REQUIRED,
    )
    if FrontEnv.IDENTITY_HEADER in env:
        names = (FrontEnv.IDENTITY_HEADER, FrontEnv.IDENTITY_BEARER, FrontEnv.IDENTITY_REQUIRED)
        assert [as_env(params[p]) for p in identity] == [env[n] for n in names]
    else:
        assert [params[p] for p in identity] == ["", False, False]
    salted = isolation["mode"] != "Shared"
    assert params.get(TenantSaltParam.SALT_KEY_FILE) == (SALT_KEY_FILE if salted else None)
    # in every mode (Shared too) the front gets the salt key, to check what the picker's
    # predicted-match plugin signs with it (issue 39)
    assert env.get(FrontEnv.SALT_KEY_FILE) == SALT_KEY_FILE
    predicted = [p for p in config(manifests)["plugins"] if p["type"] == PREDICTED_MATCH_PLUGIN]
    parameters = {"saltKeyFile": SALT_KEY_FILE, "producerName": PREFIX_PRODUCER}
    assert predicted == [{"type": PREDICTED_MATCH_PLUGIN, "parameters": parameters}]
    epp = epp_pod(manifests)
    mounts = [m["mountPath"] for c in epp["containers"] for m in c.get("volumeMounts", [])]
    assert SALT_KEY_MOUNT_DIR in mounts
    secrets = [
        v["secret"]["secretName"] for v in epp.get("volumes", []) if "secret" in v
    ]  # the Secret the operator generates for the resource, as for a salting mode
    assert len(secrets) == 1


def test_without_the_front_nothing_is_signed() -> None:
    manifests = rendered(
        gateway=OURS,
        isolation={"mode": "Shared"},
        front={"enabled": False, "usageHeaders": {"enabled": False}},
    )
    types = [p["type"] for p in config(manifests)["plugins"]]
    assert PREDICTED_MATCH_PLUGIN not in types


@pytest.mark.parametrize("mode", ["Shared", "PerKey"])
def test_the_pod_is_the_picker_alone_and_the_network_policy_matches_it(mode: str) -> None:
    manifests = rendered(gateway=OURS, isolation={"mode": mode})
    pod = epp_pod(manifests)
    (epp,) = pod["containers"]
    assert epp["name"] != GATEWAY_POLICY_CONTAINER
    assert epp["image"] == f"ghcr.io/promptcache/promptcache-picker:{__version__}"
    args = epp["args"]
    assert args[args.index("--grpc-port") + 1] == str(EPP_EXT_PROC_PORT)
    assert "--secure-serving=false" not in args  # alone on the Service's port: TLS
    mounts = {m["mountPath"] for m in epp["volumeMounts"]}
    # the salt key in every mode: it derives salts, and signs predictions (Shared too)
    assert SALT_KEY_FILE.rsplit("/", 1)[0] in mounts
    assert any("secret" in v for v in pod["volumes"])
    (policy,) = [
        m
        for m in manifests
        if m["kind"] == "NetworkPolicy" and m["metadata"]["name"].endswith("-epp")
    ]
    allowed = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    served = {p["containerPort"] for p in epp["ports"]}
    assert allowed == served


@pytest.mark.parametrize(
    ("front", "want_bytes", "want_seconds"),
    [
        ({}, "268435456", "60"),
        ({"maxRequestBytes": 65536, "bodyTimeoutSeconds": 2.5}, "65536", "2.5"),
    ],
)
def test_the_picker_bounds_bodies_with_the_fronts_limits(
    front: dict[str, Any], want_bytes: str, want_seconds: str
) -> None:
    """No step reads the body first: the picker refuses with 413 / 408 what the front
    would, before holding more of it (picker/boundary)."""
    manifests = rendered(gateway=OURS, front=front)
    (epp,) = epp_pod(manifests)["containers"]
    args = epp["args"]
    assert args[args.index(PickerFlag.MAX_BODY_BYTES) + 1] == want_bytes
    assert args[args.index(PickerFlag.BODY_TIMEOUT_SECONDS) + 1] == want_seconds
    env = front_env(manifests)
    assert (env[FrontEnv.MAX_BODY_BYTES], env[FrontEnv.BODY_TIMEOUT_SECONDS]) == (
        want_bytes,
        want_seconds,
    )
    # The other pickers do not know the flags (an unknown flag stops them).
    for picker in ("gie-v1.5", "llm-d-router"):
        pod = epp_pod(rendered(gateway={"picker": picker}, front=front))
        assert not {f.value for f in PickerFlag} & set(pod["containers"][0]["args"])


@pytest.mark.parametrize(
    ("front", "sizing", "limit_mib"),
    [
        ({}, {}, 512 + 8 * 256),  # one maximal body (256 MiB) at 8 bytes per byte
        ({"maxRequestBytes": 1024**2}, {}, 2048),  # never below every picker's 2 GiB
        ({"maxRequestBytes": 1024**2}, {"requestKiB": 2048}, 512 + 8 * 512),  # 256 typical
    ],
)
def test_its_memory_limit_holds_the_bodies_it_may_read(
    front: dict[str, Any], sizing: dict[str, Any], limit_mib: int
) -> None:
    (epp,) = epp_pod(rendered(gateway={**OURS, "sizing": sizing}, front=front))["containers"]
    assert epp["resources"]["requests"]["memory"] == "512Mi"
    assert epp["resources"]["limits"]["memory"] == f"{limit_mib}Mi"
    env = {e["name"]: e.get("value") for e in epp["env"]}
    assert env["GOMEMLIMIT"] == f"{limit_mib * 9 // 10}MiB"
    assert env["GOGC"] == "400"  # bounded by GOMEMLIMIT, it collects less often below it
    for picker in ("gie-v1.5", "llm-d-router"):  # behind the step: the index's memory
        (other, *_) = epp_pod(rendered(gateway={"picker": picker}, front=front))["containers"]
        assert other["resources"]["limits"]["memory"] == "2Gi"
        assert not {"GOMEMLIMIT", "GOGC"} & {e["name"] for e in other["env"]}


def test_the_step_still_fronts_the_other_pickers() -> None:
    for picker in ("gie-v1.5", "llm-d-router"):
        pod = epp_pod(rendered(gateway={"picker": picker}, isolation={"mode": "PerKey"}))
        assert [c["name"] for c in pod["containers"]] == ["epp", GATEWAY_POLICY_CONTAINER]
        assert "parser" not in config(rendered(gateway={"picker": picker}))


def test_the_api_refuses_for_it_what_it_refuses_for_gie() -> None:
    """The pickers GIE's picker is underneath lack what GIE's lacks (their rows in the
    profile table), so the API refuses tiers, vLLM's render and a custom LRU for both."""
    for feature in (Feature.PREFIX_TIERS, Feature.TOKEN_PRODUCER, Feature.LRU_CAPACITY):
        assert {p for p in PickerTarget if PROFILES[p].gie_based} == set(lacking(feature))
