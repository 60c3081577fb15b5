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
from promptcache.tenancy.identity import Account
from promptcache.tenancy.policy import (
    Isolation,
    check_route_isolated,
    check_uncacheable,
    foreign_salt,
    isolation_key,
    require_identity,
    require_key,
    salt,
    session,
    strip_client_fields,
    usage,
)
from promptcache.tenancy.routes import ROUTES, RouteClass, find_route
from promptcache.tenancy.salt import (
    KEYED_SALT_PREFIX,
    UNCACHEABLE_SALT_PREFIX,
    derive_account_salt,
    derive_salt,
)
from promptcache.tenancy.settings import PolicySettings, SettingsError

SECRET = b"k" * 32
CHAT = find_route("/v1/chat/completions")
KEY_HEADER = PolicySettings().isolation_header


def test_strip_client_fields_removes_the_clients_salt_and_request_id() -> None:
    body: dict[str, Any] = {CACHE_SALT_FIELD: "forged", VLLM_REQUEST_ID_FIELD: "r", "a": 1}
    assert strip_client_fields(body) == ("forged", True)
    assert body == {"a": 1}
    assert strip_client_fields(body) == (None, False)


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


# ------------------------------------------------------------ isolation by account (#27)

ACCOUNT = Account(b"a" * 32)
BY_ACCOUNT = PolicySettings(
    isolation_mode=IsolationMode.PER_KEY, identity_header="x-user", identity_required=True
)


def test_require_identity_refuses_salted_requests_without_an_account_with_401() -> None:
    require_identity(CHAT, ACCOUNT, BY_ACCOUNT)
    require_identity(find_route("/v1/models"), None, BY_ACCOUNT)  # read-only: not salted
    require_identity(CHAT, None, PolicySettings(isolation_mode=IsolationMode.PER_KEY))
    with pytest.raises(FrontError) as refused:
        require_identity(CHAT, None, BY_ACCOUNT)
    assert (refused.value.status, refused.value.code) == (401, errors.IDENTITY_REQUIRED)
    assert refused.value.body()["error"]["type"] == "authentication_error"
    assert refused.value.param == "x-user"


def test_salt_of_an_account_with_and_without_a_key() -> None:
    mode = IsolationMode.PER_KEY
    assert salt(CHAT, None, None, mode, SECRET, account=ACCOUNT) == (
        Isolation.ACCOUNT,
        derive_account_salt(SECRET, ACCOUNT.digest, None),
    )
    _, keyed = salt(CHAT, "k", None, mode, SECRET, account=ACCOUNT)
    assert keyed == derive_account_salt(SECRET, ACCOUNT.digest, "k") != derive_salt(SECRET, "k")
    # uncacheable and Shared win over the account, as over a key
    assert salt(CHAT, "k", 0, mode, SECRET, account=ACCOUNT)[0] is Isolation.UNCACHEABLE
    assert salt(CHAT, "k", None, IsolationMode.SHARED, SECRET, account=ACCOUNT) == (
        Isolation.SHARED,
        None,
    )


def test_an_empty_isolation_key_is_no_key_in_every_mode() -> None:
    """spec/004 leaves it open; the product reads "" as "no key sent" (header or field)."""
    for mode in IsolationMode:
        policy = PolicySettings(isolation_mode=mode)
        assert isolation_key(CIMultiDict({KEY_HEADER: ""}), {}, policy) is None
        assert isolation_key(CIMultiDict(), {policy.isolation_field: ""}, policy) is None
        # and so: Required refuses it, PerKey shares it, an account keeps it as no key
        if mode is IsolationMode.REQUIRED:
            with pytest.raises(FrontError):
                require_key(CHAT, None, policy)
    assert isolation_key(CIMultiDict({KEY_HEADER: ""}), {BY_ACCOUNT.isolation_field: "k"},
                         BY_ACCOUNT) == "k"  # fmt: skip


def test_uncacheable_is_refused_where_no_salt_can_carry_it() -> None:
    cohere = find_route("/cohere/v2/chat")
    check_uncacheable(cohere, None)
    check_uncacheable(cohere, 5)  # a positive limit is accepted (and not enforced) anyway
    check_uncacheable(CHAT, 0)
    check_uncacheable(find_route("/tokenize"), 0)  # no KV cache to keep it out of
    with pytest.raises(FrontError) as refused:
        check_uncacheable(cohere, 0)
    assert refused.value.code == errors.PROMPT_CACHE_MAX_LEN_NOT_SUPPORTED
    assert refused.value.param == "prompt_cache_max_len"


def test_a_salt_counts_as_foreign_unless_it_is_the_policys_own() -> None:
    own = derive_salt(SECRET, "k")
    assert not foreign_salt(None, Isolation.KEYED, own)
    assert not foreign_salt(own, Isolation.KEYED, own)  # the gateway's step set it
    assert foreign_salt("forged", Isolation.KEYED, own)
    assert foreign_salt(own, Isolation.UNKEYED, None)  # a keyed salt on a keyless request
    assert not foreign_salt(UNCACHEABLE_SALT_PREFIX + "x", Isolation.UNCACHEABLE, "other")
    assert foreign_salt("x", Isolation.UNCACHEABLE, "other")


def test_identity_settings_are_checked_by_the_policys_rules() -> None:
    with pytest.raises(SettingsError, match="Shared"):
        PolicySettings(isolation_mode=IsolationMode.SHARED, identity_bearer=True)
    with pytest.raises(SettingsError, match="no source"):
        PolicySettings(isolation_mode=IsolationMode.PER_KEY, identity_required=True)
    with pytest.raises(SettingsError, match="isolation-key header"):
        PolicySettings(isolation_mode=IsolationMode.PER_KEY, identity_header=KEY_HEADER)
    with pytest.raises(SettingsError, match="Authorization"):
        PolicySettings(isolation_mode=IsolationMode.PER_KEY, identity_header="authorization")
