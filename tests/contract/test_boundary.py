"""The boundary between the planes, checked across it: for any valid resource, every container
the renderer emits for one of our processes starts with settings that mean what the spec says.

Each container's `args` go through the real `promptcache` argument parser and its `env`
through the process' own settings reader (`settings_from`), exactly as at pod start; the
parsed settings are then compared with the resource, field by field.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.resource_strategies import resources
from promptcache.api import PromptCacheDeployment, ceiling_of, resolved
from promptcache.cli import build_parser
from promptcache.contract import SALT_KEY_SECRET_KEY, IsolationMode
from promptcache.contract.front import DEFAULT_MAX_IN_FLIGHT
from promptcache.contract.picker import PickerTarget
from promptcache.front.command import settings_from as front_settings_from
from promptcache.front.settings import FrontSettings
from promptcache.gateway.command import settings_from as gateway_policy_settings_from
from promptcache.gateway.settings import GatewayPolicySettings
from promptcache.loading import load_resources
from promptcache.render import render
from promptcache.render.epp import GATEWAY_POLICY_CONTAINER, POLICY_COMMAND, uses_policy_step
from promptcache.render.front import FRONT_CONTAINER
from promptcache.render.picker import picker_of
from promptcache.yamlio import dump


def _containers(manifests: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod spec, container) for every container of every Deployment."""
    out = []
    for m in manifests:
        if m["kind"] == "Deployment":
            pod = m["spec"]["template"]["spec"]
            out += [(pod, c) for c in pod["containers"]]
    return out


def _env(container: dict[str, Any]) -> dict[str, str]:
    env = {}
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = entry["value"]
    return env


def _start(container: dict[str, Any]) -> Any:
    """What the process does at start: parse its argv with the real CLI parser."""
    return build_parser().parse_args(container["args"])


def _port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def _check_front(pcd: PromptCacheDeployment, pod: dict[str, Any], c: dict[str, Any]) -> None:
    spec = pcd.spec
    s: FrontSettings = front_settings_from(_start(c), _env(c))
    iso, usage, session = spec.isolation, spec.front.usage_headers, spec.session_affinity
    assert s.isolation_mode is IsolationMode(iso.mode)
    assert s.isolation_header == iso.header  # "" stays "": do not read one
    assert s.isolation_field == iso.body_field
    assert s.honor_prompt_cache_max_len is (iso.honor_prompt_cache_max_len is not False)
    assert s.prompt_embeds_cache_gib == spec.prompt_embeds.effective_cache_gib
    assert s.cache_capacity_bytes == ceiling_of(pcd).per_process_bytes
    assert s.max_body_bytes == spec.front.max_request_bytes
    _check_front_limits(spec, s)
    assert s.workers == spec.engine.api_server_count
    assert s.prompt_tokens_header == (usage.prompt_tokens_header if usage.enabled else "")
    assert s.cached_prompt_tokens_header == (
        usage.cached_prompt_tokens_header if usage.enabled else ""
    )
    assert s.session_header == (session.header if session.enabled else "")
    assert s.session_from_user is (session.enabled and session.use_user_field)
    # the front serves the port the container declares, and reaches the vLLM it is in front of
    assert _port_of(s.listen) == c["ports"][0]["containerPort"]
    vllm = next(x for x in pod["containers"] if x["name"] == "vllm")
    assert s.upstream == f"http://{_flag(vllm['args'], '--host')}:{_flag(vllm['args'], '--port')}"
    # a salting mode reads its key from a file a mounted Secret provides
    assert s.needs_salt_key is spec.needs_salt_key
    if s.needs_salt_key:
        mount = next(m for m in c["volumeMounts"] if s.salt_key_file.startswith(m["mountPath"]))
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        assert s.salt_key_file == f"{mount['mountPath']}/{SALT_KEY_SECRET_KEY}"
        assert volume["secret"]["items"][0]["path"] == SALT_KEY_SECRET_KEY


def _check_front_limits(spec: Any, s: FrontSettings) -> None:
    """The front's limits (issue 11) as the resource sets them, or as documented when unset."""
    front = spec.front
    # maxConcurrency; empty: engine.maxNumSeqs, else vLLM's own default of 256
    assert s.max_in_flight == (
        front.max_concurrency
        if front.max_concurrency is not None
        else spec.engine.max_num_seqs or DEFAULT_MAX_IN_FLIGHT
    )
    # memoryBudgetBytes; empty: max(1 GiB, 4 maximal requests (5 x maxRequestBytes each),
    # one maximal request within one client's share)
    one = 5 * front.max_request_bytes
    assert s.max_in_flight_bytes == (
        front.memory_budget_bytes
        if front.memory_budget_bytes is not None
        else max(1 << 30, 4 * one, -(-one * 100 // front.tenant_share_percent))
    )
    assert s.max_in_flight_bytes >= s.max_body_bytes  # one maximal request always fits
    assert s.tenant_share_percent == front.tenant_share_percent
    if front.memory_budget_bytes is None:  # no request holds more than a quarter of it
        assert one * 4 <= s.max_in_flight_bytes
        assert one <= s.max_in_flight_bytes * s.tenant_share_percent // 100
    assert s.max_body_reads == front.max_concurrent_body_reads
    assert s.header_timeout_seconds == front.header_timeout_seconds  # exactly, not rounded
    assert s.body_timeout_seconds == front.body_timeout_seconds
    assert s.max_prompt_embeds_references == front.max_prompt_embeds_references


def _check_gateway_policy(
    pcd: PromptCacheDeployment, pod: dict[str, Any], c: dict[str, Any]
) -> None:
    s: GatewayPolicySettings = gateway_policy_settings_from(_start(c), _env(c))
    session = pcd.spec.session_affinity
    # Only a picker with a session plugin is told the session header (GIE refuses sessions).
    names_sessions = session.enabled and picker_of(pcd) is PickerTarget.LLM_D_ROUTER
    assert s.session_header == (session.header if names_sessions else "")
    assert s.user_field == ("user" if session.use_user_field else "")
    assert _port_of(s.listen) == c["ports"][0]["containerPort"]
    epp = next(x for x in pod["containers"] if x["name"] == "epp")
    assert _port_of(s.upstream) == int(_flag(epp["args"], "--grpc-port"))
    assert s.max_buffered_bytes >= s.max_body_bytes
    # the front's share and body deadline; deciding one maximal body (bytes, parse,
    # re-encoding) within one client's share of the step's budget, its bytes within one
    # client's share of each worker's, and a stalled body's bytes a quarter of that at most
    front = pcd.spec.front
    assert s.tenant_share_percent == front.tenant_share_percent
    assert s.body_timeout_seconds == front.body_timeout_seconds
    assert s.max_buffered_bytes * s.tenant_share_percent // 100 >= 4 * s.max_body_bytes
    assert s.worker_budget * s.tenant_share_percent // 100 >= s.max_body_bytes


CHECKS = {"front": _check_front, POLICY_COMMAND: _check_gateway_policy}
"""Our processes, by the sub-command the container runs."""


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(doc=resources())
def test_every_rendered_process_parses_what_the_spec_says(doc: dict[str, Any]) -> None:
    # through YAML, as `kubectl apply` and the operator see the resource
    (written,) = load_resources(dump(doc), source="generated")
    pcd = resolved(written)
    checked = set()
    for pod, c in _containers(render(pcd)):
        command = c.get("args", [None])[0]
        if command in CHECKS:
            CHECKS[command](pcd, pod, c)
            checked.add(c["name"])
    assert (FRONT_CONTAINER in checked) is pcd.spec.front.enabled
    assert (GATEWAY_POLICY_CONTAINER in checked) is uses_policy_step(pcd)


@given(
    header=st.sampled_from(["x.tenant", "x_tenant", "x!#$%&'*+.^_`|~-"]),
    field=st.sampled_from(["", "tenant_key"]),
)
@settings(max_examples=10, deadline=None)
def test_unusual_header_names_the_api_accepts_start_the_front(header: str, field: str) -> None:
    """Regression: `isolation.header: x.tenant` passed the API and crash-looped the front."""
    doc = {
        "apiVersion": "serving.promptcache.io/v1alpha1",
        "kind": "PromptCacheDeployment",
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {"model": {"name": "m"}, "isolation": {"header": header, "bodyField": field}},
    }
    (pcd,) = load_resources(dump(doc), source="t")
    pod, c = next((p, c) for p, c in _containers(render(pcd)) if c["name"] == FRONT_CONTAINER)
    _check_front(pcd, pod, c)


def test_front_timeouts_reach_the_front_unrounded() -> None:
    """Regression: the renderer wrote timeouts with `:g` (6 significant digits), so a
    `bodyTimeoutSeconds: 0.001953125` became 0.00195312 in the front."""
    doc = {
        "apiVersion": "serving.promptcache.io/v1alpha1",
        "kind": "PromptCacheDeployment",
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {
            "model": {"name": "m"},
            "engine": {"maxNumSeqs": 17},
            "front": {"headerTimeoutSeconds": 1234.5678, "bodyTimeoutSeconds": 0.001953125},
        },
    }
    (pcd,) = load_resources(dump(doc), source="t")
    pod, c = next((p, c) for p, c in _containers(render(pcd)) if c["name"] == FRONT_CONTAINER)
    _check_front(pcd, pod, c)
    s = front_settings_from(_start(c), _env(c))
    assert (s.header_timeout_seconds, s.body_timeout_seconds) == (1234.5678, 0.001953125)
    assert s.max_in_flight == 17  # maxConcurrency unset: the engine's maxNumSeqs
