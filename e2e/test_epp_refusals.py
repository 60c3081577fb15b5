"""Refusal parity: behind promptcache's picker the cache front refuses what the step did.

Under `llm-d-router` and `gie-v1.5` the gateway's policy step answers a request the
isolation rules refuse before any pick. promptcache's picker (the default) has no step: it
routes such a request with a one-off salt (it attracts and adds to no tenant's prefixes)
and the cache front in the picked pod answers it. For every refusal the step gives at the
gateway (`Required` without a key, `identity_required`, a malformed key or identity), this
sends the same request both ways, over real sockets: to the rendered step (in front of the
GIE picker) and through the real promptcache picker to the real front on the pod it picked,
as Envoy forwards it (`envoy_applies`). Status and JSON body must be equal, and nothing
reaches the engine. docs/endpoint-picker.md, 'The promptcache picker', says so for clients.
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from harness.epp.extproc import chat_body
from harness.epp.launch import Launcher, routing_patch
from harness.epp.pool import PodHandle, PoolOnCluster
from harness.epp.scenarios import unique_text
from harness.extproc_gateway import envoy_applies
from promptcache.contract import DEFAULT_ISOLATION_FIELD, DEFAULT_ISOLATION_HEADER, PickerTarget
from promptcache.tenancy.identity import MAX_IDENTITY_CHARS
from promptcache.tenancy.policy import MAX_ISOLATION_KEY_CHARS

pytestmark = [pytest.mark.epp, pytest.mark.cluster]

KEY, FIELD, USER = DEFAULT_ISOLATION_HEADER, DEFAULT_ISOLATION_FIELD, "x-account-id"
BY_ACCOUNT = {"header": USER, "bearerToken": True}
ISOLATIONS: dict[str, dict[str, Any]] = {
    "required-key": {"mode": "Required", "identity": BY_ACCOUNT},
    "required-account": {"mode": "PerKey", "identity": {**BY_ACCOUNT, "required": True}},
}
"""The two isolation settings whose refusals are compared: a key is required (accounts
optional), and an account is required (keys optional)."""


@dataclass(frozen=True)
class Case:
    name: str
    headers: dict[str, str]
    body: dict[str, Any]
    code: str
    """The `error.code` both must answer with (the step's today)."""
    raw: bytes | None = None
    """The body as bytes, for what a dict cannot say (a member named twice)."""

    def sent(self) -> dict[str, Any] | bytes:
        return self.raw if self.raw is not None else {**chat_body(unique_text(300)), **self.body}


TWICE = (
    b'{"model":"m","messages":[{"role":"user","content":"hi"}],'
    b'"prompt_cache_isolation_key":"a","prompt_cache_isolation_key":"b"}'
)
"""Go's decoder keeps the last member, Python's refuses the body: re-encoded by GIE it
would reach the front as a valid one-key body."""


CASES: dict[str, tuple[Case, ...]] = {
    "required-key": (
        Case("no key", {}, {}, "isolation_key_required"),
        Case("an empty key", {KEY: ""}, {}, "isolation_key_required"),
        Case("key too long", {KEY: "k" * (MAX_ISOLATION_KEY_CHARS + 1)}, {},
             "invalid_isolation_key"),
        Case("key field not a string", {}, {FIELD: 5}, "invalid_isolation_key"),
        Case("header and field disagree", {KEY: "a"}, {FIELD: "b"}, "invalid_isolation_key"),
        Case("key a lone surrogate", {}, {FIELD: "t\ud800"}, "invalid_isolation_key"),
        Case("key field named twice", {}, {}, "duplicate_field", raw=TWICE),
        Case("bearer token with a quote", {KEY: "a", "authorization": 'Bearer "x'}, {},
             "invalid_identity"),
        Case("identity too long", {KEY: "a", USER: "u" * (MAX_IDENTITY_CHARS + 1)}, {},
             "invalid_identity"),
    ),
    "required-account": (
        Case("no account", {KEY: "a"}, {}, "identity_required"),
        Case("another scheme is no account", {"authorization": "Basic dTpw"}, {},
             "identity_required"),
        Case("an empty bearer token", {"authorization": "Bearer "}, {}, "invalid_identity"),
        Case("bearer token with a space", {"authorization": "Bearer a b"}, {},
             "invalid_identity"),
        Case("key too long", {USER: "alice", KEY: "k" * (MAX_ISOLATION_KEY_CHARS + 1)}, {},
             "invalid_isolation_key"),
    ),
}  # fmt: skip


@pytest.fixture
def second_namespace(cluster: Any) -> Iterator[str]:
    """The step's pool lives apart: both pools render the same example (one name)."""
    name = str(cluster.create_namespace("step"))
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            cluster.core.delete_namespace(name)


def _pool(launcher: Launcher, isolation: dict[str, Any]) -> PoolOnCluster:
    patch = routing_patch(replicas=1, with_front=True)
    patch["isolation"] = isolation
    return launcher(spec_patch=patch)


def _post(handle: PodHandle, body: bytes, headers: list[tuple[str, str]]) -> tuple[int, Any]:
    """What the front in the picked pod answers the request as Envoy forwards it."""
    assert handle.front is not None
    skip = {"host", "content-length", "transfer-encoding"}
    sent = {k: v for k, v in headers if not k.startswith(":") and k.lower() not in skip}
    request = urllib.request.Request(
        f"http://{handle.ip}:{handle.front.port}/v1/chat/completions",
        data=body,
        headers={"content-type": "application/json", **sent},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.parametrize("isolation", list(ISOLATIONS))
def test_the_front_after_our_picker_refuses_exactly_as_the_step(
    cluster: Any, namespace: str, second_namespace: str, tmp_path: Path, isolation: str
) -> None:
    ours = Launcher(cluster, namespace, tmp_path / "ours", PickerTarget.PROMPTCACHE)
    stepped = Launcher(cluster, second_namespace, tmp_path / "step", PickerTarget.GIE)
    try:
        alone = _pool(ours, ISOLATIONS[isolation])
        behind_step = _pool(stepped, ISOLATIONS[isolation])
        assert alone.shim is None
        assert behind_step.shim is not None
        (pod,) = alone.pods
        with alone.client() as picker, behind_step.client() as step:
            for case in CASES[isolation]:
                body = case.sent()
                at_step = step.pick(body, headers=case.headers)
                assert at_step.endpoint is None, f"{case.name}: the step let it pass"
                expected = (at_step.immediate_status, json.loads(at_step.immediate_body))
                assert expected[1]["error"]["code"] == case.code, case.name
                served = len(pod.server.served)
                pick = picker.pick(body, headers=case.headers)
                assert pick.endpoint == pod.endpoint, f"{case.name}: our picker did not route it"
                got = _post(pod, pick.body, envoy_applies(pick.sent_headers, pick.responses))
                assert got == expected, case.name
                assert len(pod.server.served) == served, f"{case.name}: the engine got it"
            # the control: a request both let through is served behind our picker
            allowed = {KEY: "a", USER: "alice"}
            assert step.pick(chat_body("hello"), headers=allowed).endpoint is not None
            pick = picker.pick(chat_body("hello"), headers=allowed)
            pod_headers = envoy_applies(pick.sent_headers, pick.responses)
            assert _post(pod, pick.body, pod_headers)[0] == 200
    finally:
        ours.close()
        stepped.close()
