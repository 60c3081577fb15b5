"""The renderer: pure, deterministic, schema-valid, and saying what will really happen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings

from harness.epp import accepted_parameters
from harness.resource_strategies import resources
from harness.resources import by_kind
from harness.schemas import ROOT, validate_manifest
from promptcache.api import parse_resource, resolved
from promptcache.contract import (
    SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR,
    TENANT_SALT_PARSER,
    FrontEnv,
    PickerTarget,
    TenantSaltParam,
)
from promptcache.loading import load_resources
from promptcache.render import render
from promptcache.render.epp_config import endpoint_picker_config
from promptcache.render.picker import picker_of, picker_target
from promptcache.yamlio import dump_all

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
ACCEPTED = accepted_parameters()


def example(name: str) -> Any:
    return resolved(load_resources((ROOT / "examples" / name).read_text(), source=name)[0])


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container["env"]}


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    return next(
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name
    )


def _flatten_keys(params: dict[str, Any], prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for key, value in params.items():
        path = f"{prefix}{key}"
        keys.add(path)
        if isinstance(value, dict):
            keys |= _flatten_keys(value, path + ".")
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            for item in value:
                keys |= _flatten_keys(item, path + "[].")
    return keys


API_VERSIONS = {
    PickerTarget.LLM_D_ROUTER: "llm-d.ai/v1alpha1",
    PickerTarget.GIE: "inference.networking.x-k8s.io/v1alpha1",
    PickerTarget.PROMPTCACHE: "inference.networking.x-k8s.io/v1alpha1",
}
ACCEPTED_WITH_PARSER = {**ACCEPTED, TENANT_SALT_PARSER: [p.value for p in TenantSaltParam]}
"""Our picker also takes its tenant-salt parser (picker/README.md)."""


def assert_epp_config_is_accepted(
    config: dict[str, Any], picker: PickerTarget = PickerTarget.LLM_D_ROUTER
) -> None:
    assert config["apiVersion"] == API_VERSIONS[picker]
    parser = {"parser"} if picker is PickerTarget.PROMPTCACHE else set()
    assert set(config) == {"apiVersion", "kind", "plugins", "schedulingProfiles", *parser}
    names = [p.get("name", p["type"]) for p in config["plugins"]]
    assert len(names) == len(set(names)), "plugin names must be unique"
    accepted = ACCEPTED_WITH_PARSER if parser else ACCEPTED
    for plugin in config["plugins"]:
        assert plugin["type"] in accepted, plugin["type"]
        unknown = _flatten_keys(plugin.get("parameters", {})) - set(accepted[plugin["type"]])
        assert not unknown, f"{plugin['type']} does not accept {unknown}"
    for profile in config["schedulingProfiles"]:
        for ref in profile["plugins"]:
            assert ref["pluginRef"] in names


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_render_to_schema_valid_manifests(path: Path) -> None:
    for pcd in load_resources(path.read_text(), source=path.name):
        for manifest in render(pcd):
            validate_manifest(manifest)


@pytest.mark.slow  # 40 resources schema-validated, ~30 s: scripts/test runs it
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(resources())
def test_any_valid_resource_renders_deterministically_and_validly(doc: dict[str, Any]) -> None:
    pcd = parse_resource(doc)
    first = dump_all(render(pcd))
    again = dump_all(render(parse_resource(yaml.safe_load(yaml.safe_dump(doc)))))
    assert first == again
    manifests = render(pcd)
    for manifest in manifests:
        validate_manifest(manifest)
        labels = manifest["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == pcd.metadata.name
        assert labels["app.kubernetes.io/managed-by"] == "promptcache"
        assert manifest["metadata"]["namespace"] == pcd.metadata.namespace
        assert "ownerReferences" not in manifest["metadata"]
    pcd = resolved(pcd)
    config = endpoint_picker_config(pcd)
    assert_epp_config_is_accepted(config, picker_of(pcd))
    for plugin in config["plugins"]:
        if plugin["type"] == "approx-prefix-cache-producer":
            floor = picker_target(pcd).min_block_size_tokens
            assert plugin["parameters"]["blockSizeTokens"] >= floor
    deployment = by_kind(manifests, "Deployment", "model-server")
    selector = deployment["spec"]["selector"]["matchLabels"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    pool = by_kind(manifests, "InferencePool")
    assert pool["spec"]["selector"]["matchLabels"] == selector
    names = [c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]]
    assert names == (["cache-front", "vllm"] if pcd.spec.front.enabled else ["vllm"])


def test_the_model_server_pod() -> None:
    pcd = example("multi-tenant.yaml")
    manifests = render(pcd)
    deployment = by_kind(manifests, "Deployment", "model-server")
    vllm = container(deployment, "vllm")
    assert vllm["args"] == [
        "meta-llama/Llama-3.1-8B-Instruct",
        "--served-model-name",
        "llama-3.1-8b",
        "--host",
        "127.0.0.1",
        "--port",
        "8001",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--api-server-count",
        "2",
        "--block-size",
        "16",
        "--gpu-memory-utilization",
        "0.92",
        "--max-model-len",
        "32768",
        "--enable-prompt-embeds",
    ]
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "ports" not in vllm, "vLLM must not be reachable from outside the pod"
    front = container(deployment, "cache-front")
    env = env_of(front)
    assert env[SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR] == "2"
    assert env[FrontEnv.WORKERS] == "2"
    assert env[FrontEnv.ISOLATION_MODE] == "Required"
    assert env[FrontEnv.SALT_KEY_FILE] == "/etc/promptcache/salt/salt-key"
    assert front["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    # 2 processes x (2 GiB of cache + 4 x 5 x 256 MiB of request budget + 640 MiB base):
    # four maximal requests per budget, so none (and no single client) holds all of it
    assert front["resources"]["limits"]["memory"] == "15616Mi"
    # half a core per process, and no CPU limit (a quota would stall the front's bursts)
    assert front["resources"]["requests"]["cpu"] == "1000m"
    assert "cpu" not in front["resources"]["limits"]
    assert env[FrontEnv.MAX_IN_FLIGHT_BYTES] == str(4 * 5 * 256 * 1024**2)
    assert env[FrontEnv.TENANT_SHARE_PERCENT] == "50"
    assert env[FrontEnv.MAX_IN_FLIGHT] == "256"  # vLLM's max_num_seqs default
    assert env[FrontEnv.MAX_BODY_READS] == "128"
    assert env[FrontEnv.HEADER_TIMEOUT_SECONDS] == "30"
    assert env[FrontEnv.BODY_TIMEOUT_SECONDS] == "60"
    assert env[FrontEnv.MAX_PROMPT_EMBEDS_REFERENCES] == "1024"
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["salt-key"]["secret"]["secretName"] == "llama-tenants-salt"
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory"}
    assert volumes["model-cache"]["emptyDir"] == {"sizeLimit": "40Gi"}


def _model_server(spec: dict[str, Any]) -> dict[str, Any]:
    """The model-server Deployment of a resource for model `m` with `spec` on top."""
    pcd = parse_resource(
        {
            "apiVersion": "serving.promptcache.io/v1alpha1",
            "kind": "PromptCacheDeployment",
            "metadata": {"name": "limits"},
            "spec": {"model": {"name": "m"}, **spec},
        }
    )
    return by_kind(render(pcd), "Deployment", "model-server")


def test_front_limits_follow_the_engine_and_the_resource() -> None:
    def render_front(spec: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
        deployment = _model_server(spec)
        return container(deployment, "vllm")["args"], env_of(container(deployment, "cache-front"))

    args, env = render_front({"engine": {"maxNumSeqs": 512}})
    assert args[args.index("--max-num-seqs") + 1] == "512"
    assert env[FrontEnv.MAX_IN_FLIGHT] == "512"
    args, env = render_front(
        {
            "engine": {"maxNumSeqs": 512},
            "front": {
                "maxConcurrency": 64,
                "memoryBudgetBytes": 3 * 1024**3,
                "maxConcurrentBodyReads": 8,
                "headerTimeoutSeconds": 5,
                "bodyTimeoutSeconds": 12.5,
                "maxPromptEmbedsReferences": 16,
                "allowClientPriority": True,
                "allowEngineState": True,
            },
        }
    )
    assert env[FrontEnv.MAX_IN_FLIGHT] == "64"
    assert env[FrontEnv.MAX_IN_FLIGHT_BYTES] == str(3 * 1024**3)
    assert env[FrontEnv.MAX_BODY_READS] == "8"
    assert env[FrontEnv.HEADER_TIMEOUT_SECONDS] == "5"
    assert env[FrontEnv.BODY_TIMEOUT_SECONDS] == "12.5"
    assert env[FrontEnv.MAX_PROMPT_EMBEDS_REFERENCES] == "16"
    assert env[FrontEnv.ALLOW_CLIENT_PRIORITY] == "true"
    assert env[FrontEnv.ALLOW_ENGINE_STATE] == "true"
    args, default_env = render_front({})
    assert default_env[FrontEnv.ALLOW_CLIENT_PRIORITY] == "false"
    assert default_env[FrontEnv.ALLOW_ENGINE_STATE] == "false"
    assert "--max-num-seqs" not in args
    with pytest.raises(ValueError, match=r"memoryBudgetBytes is below front\.maxRequestBytes"):
        render_front({"front": {"memoryBudgetBytes": 1024**2, "maxRequestBytes": 2 * 1024**2}})


def test_without_the_front_vllm_serves_the_pool_port() -> None:
    pcd = parse_resource(
        {
            "apiVersion": "serving.promptcache.io/v1alpha1",
            "kind": "PromptCacheDeployment",
            "metadata": {"name": "plain"},
            "spec": {
                "model": {"name": "m"},
                "isolation": {"mode": "Shared"},
                "front": {"enabled": False, "usageHeaders": {"enabled": False}},
            },
        }
    )
    deployment = by_kind(render(pcd), "Deployment", "model-server")
    vllm = container(deployment, "vllm")
    assert vllm["args"][4:7] == ["0.0.0.0", "--port", "8000"]
    assert vllm["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert all(v["name"] != "salt-key" for v in deployment["spec"]["template"]["spec"]["volumes"])


def test_epp_config_for_the_multi_tenant_example() -> None:
    pcd = example("multi-tenant.yaml")
    config = endpoint_picker_config(pcd)
    assert_epp_config_is_accepted(config)
    plugins = {p.get("name", p["type"]): p for p in config["plugins"]}
    session = plugins["session-affinity-filter"]["parameters"]
    assert session == {
        "strategy": "session_id",
        "sessionIdConfig": {
            "sources": [{"header": "x-session-affinity"}],
            "evictionTtlSeconds": 900,
        },
    }
    assert plugins["coarse-scorer"]["parameters"] == {
        "prefixMatchInfoProducerName": "coarse-producer"
    }
    profile = config["schedulingProfiles"][0]["plugins"]
    assert profile[0] == {"pluginRef": "session-affinity-filter"}
    weights = {p["pluginRef"]: p.get("weight") for p in profile}
    assert weights["prefix-cache-scorer"] == 3.0
    epp = by_kind(render(pcd), "Deployment", "endpoint-picker")
    args = epp["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--allow-experimental-plugins" in args
    assert args[args.index("--pool-name") + 1] == "llama-tenants"


def test_small_block_sizes_are_shown_as_the_epp_will_use_them() -> None:
    pcd = parse_resource(
        {
            "apiVersion": "serving.promptcache.io/v1alpha1",
            "kind": "PromptCacheDeployment",
            "metadata": {"name": "small"},
            "spec": {
                "model": {"name": "m"},
                "prefixCache": {"autoTune": False, "blockSizeTokens": 16},
                "gateway": {"picker": "llm-d-router"},  # the picker with the 64-token floor
            },
        }
    )
    config_map = by_kind(render(pcd), "ConfigMap")
    text = config_map["data"]["config.yaml"]
    assert "# prefixCache.blockSizeTokens=16 was raised to 64" in text
    assert yaml.safe_load(text)["plugins"][0]["parameters"]["blockSizeTokens"] == 64
    epp = by_kind(render(pcd), "Deployment", "endpoint-picker")
    assert (
        "--allow-experimental-plugins"
        not in epp["spec"]["template"]["spec"]["containers"][0]["args"]
    )


def test_route_only_when_a_gateway_is_named() -> None:
    assert all(m["kind"] != "HTTPRoute" for m in render(example("minimal.yaml")))
    route = by_kind(render(example("multi-tenant.yaml")), "HTTPRoute")
    assert route["spec"]["rules"][0]["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "llama-tenants"}
    ]


def test_render_has_no_clock_or_randomness() -> None:
    """Same input, same bytes, across two independent parses."""
    text = (ROOT / "examples" / "multi-tenant.yaml").read_text()
    a = dump_all(render(load_resources(text)[0]))
    b = dump_all(render(load_resources(text)[0]))
    assert a == b


def test_the_fronts_cpu_request_is_per_process_unless_the_resource_names_one() -> None:
    def front_resources(spec: dict[str, Any]) -> dict[str, Any]:
        resources: dict[str, Any] = container(_model_server(spec), "cache-front")["resources"]
        return resources

    assert front_resources({})["requests"] == {"cpu": "500m", "memory": "512Mi"}
    assert front_resources({"engine": {"apiServerCount": 4}})["requests"]["cpu"] == "2000m"
    named = {"resources": {"requests": {"cpu": "3", "memory": "1Gi"}, "limits": {"cpu": "4"}}}
    resources = front_resources({"engine": {"apiServerCount": 4}, "front": named})
    assert resources["requests"] == {"cpu": "3", "memory": "1Gi"}
    assert resources["limits"]["cpu"] == "4"


def test_the_token_producer_and_the_affinity_filter_are_rendered_as_spec_002_names_them() -> None:
    """llm-d-router gets a `token-producer` only when the resource names one (vLLM's render
    backend through the model Service, or the estimate), both pickers the affinity filter
    before the scorers; every parameter is one the plugin accepts."""

    def config(**prefix: Any) -> dict[str, Any]:
        doc = yaml.safe_load((ROOT / "examples" / "minimal.yaml").read_text())
        doc["spec"]["prefixCache"] = prefix
        doc["spec"].setdefault("gateway", {})["picker"] = prefix.pop("picker", "llm-d-router")
        return endpoint_picker_config(resolved(parse_resource(doc)))

    def plugin(cfg: dict[str, Any], type_: str) -> dict[str, Any] | None:
        return next((p for p in cfg["plugins"] if p["type"] == type_), None)

    assert plugin(config(), "token-producer") is None
    assert plugin(config(), "prefix-cache-affinity-filter") is None
    assert plugin(config(tokenProducer="Estimate"), "token-producer") == {"type": "token-producer"}
    render_tokens = plugin(config(tokenProducer="VllmRender"), "token-producer")
    assert render_tokens is not None
    doc = yaml.safe_load((ROOT / "examples" / "minimal.yaml").read_text())
    pcd = parse_resource(doc)
    assert render_tokens["parameters"] == {
        "modelName": pcd.spec.model.effective_served_name,
        "vllm": {"url": f"http://{pcd.metadata.name}.{pcd.metadata.namespace}.svc:8000"},
    }
    for picker in ("llm-d-router", "gie-v1.5"):
        cfg = config(affinityFilter={"enabled": True, "threshold": 0.6}, picker=picker)
        affinity = plugin(cfg, "prefix-cache-affinity-filter")
        assert affinity is not None
        assert affinity["parameters"] == {"affinityThreshold": 0.6, "explorationProbability": 0.01}
        refs = [r["pluginRef"] for r in cfg["schedulingProfiles"][0]["plugins"]]
        assert refs.index("prefix-cache-affinity-filter") < refs.index("prefix-cache-scorer")
        for p in cfg["plugins"]:
            assert not _flatten_keys(p.get("parameters", {})) - set(ACCEPTED[p["type"]]), p
    assert plugin(config(tokenProducer="Estimate", picker="gie-v1.5"), "token-producer") is None
