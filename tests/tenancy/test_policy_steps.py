"""Each named step of the request policy on its own, and the policy settings' checks.

`apply_policy` composes these steps (tests/front/test_front_policy.py holds its
properties); here each is held to its one job, so a change to one cannot hide behind
another."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

from promptcache.contract import CACHE_SALT_FIELD, IsolationMode
from promptcache.contract.front import VLLM_REQUEST_ID_FIELD
from promptcache.tenancy import errors
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.policy import (
    Isolation,
    check_route_isolated,
    isolation_key,
    require_key,
    salt,
    session,
    strip_client_fields,
    usage,
)
from promptcache.tenancy.routes import ROUTES, RouteClass, find_route
from promptcache.tenancy.salt import KEYED_SALT_PREFIX, UNCACHEABLE_SALT_PREFIX, derive_salt
from promptcache.tenancy.settings import PolicySettings, SettingsError

SECRET = b"k" * 32
CHAT = find_route("/v1/chat/completions")
KEY_HEADER = PolicySettings().isolation_header


def test_strip_client_fields_removes_the_clients_salt_and_request_id() -> None:
    body: dict[str, Any] = {CACHE_SALT_FIELD: "forged", VLLM_REQUEST_ID_FIELD: "r", "a": 1}
    assert strip_client_fields(body) == (True, True)
    assert body == {"a": 1}
    assert strip_client_fields(body) == (False, False)


def test_isolation_key_reads_header_or_field_and_refuses_two_different() -> None:
    policy = PolicySettings()
    assert isolation_key(CIMultiDict({KEY_HEADER: "t1"}), {}, policy) == "t1"
    body: dict[str, Any] = {policy.isolation_field: "t2"}
    assert isolation_key(CIMultiDict(), body, policy) == "t2"
    assert policy.isolation_field not in body  # the key never reaches vLLM
    with pytest.raises(FrontError) as refused:
        isolation_key(CIMultiDict({KEY_HEADER: "a"}), {policy.isolation_field: "b"}, policy)
    assert refused.value.code == errors.INVALID_ISOLATION_KEY


@given(st.text(min_size=1, max_size=64), st.text(min_size=1, max_size=64))
def test_salt_keyed_is_the_hmac_and_tenants_differ(a: str, b: str) -> None:
    isolation, salt_a = salt(CHAT, a, None, IsolationMode.PER_KEY, SECRET)
    assert isolation is Isolation.KEYED
    assert salt_a == derive_salt(SECRET, a)
    assert salt_a is not None
    assert salt_a.startswith(KEYED_SALT_PREFIX)
    _, salt_b = salt(CHAT, b, None, IsolationMode.PER_KEY, SECRET)
    assert (salt_a == salt_b) == (a == b)


def test_salt_uncacheable_shared_and_unkeyed() -> None:
    isolation, one = salt(CHAT, "t", 0, IsolationMode.PER_KEY, SECRET)
    _, two = salt(CHAT, "t", 0, IsolationMode.PER_KEY, SECRET)
    assert isolation is Isolation.UNCACHEABLE
    assert one is not None
    assert one.startswith(UNCACHEABLE_SALT_PREFIX)
    assert one != two
    assert salt(CHAT, "t", None, IsolationMode.SHARED, SECRET) == (Isolation.SHARED, None)
    assert salt(CHAT, None, None, IsolationMode.PER_KEY, SECRET) == (Isolation.UNKEYED, None)
    with pytest.raises(RuntimeError):
        salt(CHAT, "t", None, IsolationMode.PER_KEY, None)


def test_require_key_refuses_only_salted_routes_in_required_mode() -> None:
    required = PolicySettings(isolation_mode=IsolationMode.REQUIRED)
    with pytest.raises(FrontError) as refused:
        require_key(CHAT, None, required)
    assert refused.value.status == 400
    assert refused.value.code == errors.ISOLATION_KEY_REQUIRED
    require_key(CHAT, "t", required)
    require_key(CHAT, None, PolicySettings(isolation_mode=IsolationMode.PER_KEY))
    unsalted = next(r for r in ROUTES if r.kind is not RouteClass.SALTED)
    require_key(unsalted, None, required)


def test_check_route_isolated_refuses_a_cache_filling_route_without_a_salt_field() -> None:
    unsaltable = [r for r in ROUTES if r.kind is RouteClass.SALTED and r.reaches_kv_cache]
    unsaltable = [r for r in unsaltable if not r.salt_field]
    for route in unsaltable:
        with pytest.raises(FrontError) as refused:
            check_route_isolated(route, IsolationMode.PER_KEY)
        assert refused.value.status == 403
        check_route_isolated(route, IsolationMode.SHARED)
    check_route_isolated(CHAT, IsolationMode.REQUIRED)


def test_usage_asks_for_the_usage_chunk_only_when_headers_want_it() -> None:
    body: dict[str, Any] = {"stream": "true"}
    assert usage(CHAT, body, PolicySettings(usage_headers_enabled=True)) == (True, True)
    assert body == {"stream": True, "stream_options": {"include_usage": True}}
    body = {"stream": True, "stream_options": {"include_usage": True}}
    assert usage(CHAT, body, PolicySettings(usage_headers_enabled=True)) == (True, False)
    body = {"stream": True}
    assert usage(CHAT, body, PolicySettings()) == (True, False)
    assert "stream_options" not in body
    with pytest.raises(FrontError):
        usage(CHAT, {"stream": True, "stream_options": []}, PolicySettings())


def test_session_copies_user_only_without_a_header() -> None:
    on = PolicySettings(session_header="x-session", session_from_user=True)
    assert session(CIMultiDict(), {"user": "alice"}, on) == "alice"
    assert session(CIMultiDict({"x-session": "bob"}), {"user": "alice"}, on) is None
    assert session(CIMultiDict(), {"user": "alice"}, PolicySettings()) is None
    with pytest.raises(FrontError):
        session(CIMultiDict(), {"user": "a\r\nb"}, on)


def test_policy_settings_refuse_what_the_front_refuses() -> None:
    with pytest.raises(SettingsError, match="Required needs"):
        PolicySettings(
            isolation_mode=IsolationMode.REQUIRED, isolation_header="", isolation_field=""
        )
    with pytest.raises(SettingsError):
        PolicySettings(isolation_header="bad header")
