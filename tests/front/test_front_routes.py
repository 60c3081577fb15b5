"""The route table against vLLM's own source, and the canonical request target."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from promptcache.api.constants import DEFAULT_VLLM_IMAGE
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.routes import (
    ROUTES,
    VLLM_ROUTES_VERSION,
    RouteClass,
    canonical_target,
    check_route,
    find_route,
)
from tools import vllm_routes


@pytest.fixture(scope="module")
def vllm_table() -> set[tuple[str, str]]:
    return vllm_routes.routes_in_wheel(vllm_routes.ensure_wheel(VLLM_ROUTES_VERSION))


def test_the_table_is_for_the_vllm_the_renderer_deploys() -> None:
    assert DEFAULT_VLLM_IMAGE.rpartition(":v")[2] == VLLM_ROUTES_VERSION


def test_every_vllm_route_is_classified(vllm_table: set[tuple[str, str]]) -> None:
    # the extraction found the routes everybody knows, so an empty parse cannot pass
    assert {("POST", "/v1/chat/completions"), ("POST", "/invocations")} <= vllm_table
    classified = {(m, r.path) for r in ROUTES for m in r.methods}
    missing = sorted(vllm_table - classified, key=lambda r: r[1])
    assert not missing, f"vLLM {VLLM_ROUTES_VERSION} routes missing from tenancy/routes.py"


def test_the_table_names_no_route_vllm_lacks(vllm_table: set[tuple[str, str]]) -> None:
    own = {"/healthz"}
    stale = sorted((m, r.path) for r in ROUTES for m in r.methods if r.path not in own)
    assert [r for r in stale if r not in vllm_table] == []


def test_every_route_that_accepts_cache_salt_is_salted() -> None:
    # cache_salt fields found in vLLM's request models (protocol.py files) map to these
    for path in (
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/messages",
        "/pooling",
        "/v1/embeddings",
        "/classify",
        "/score",
        "/rerank",
        "/inference/v1/generate",
        "/invocations",
        "/generative_scoring",
    ):
        route = find_route(path)
        assert route is not None, path
        assert route.kind is RouteClass.SALTED, path


@pytest.mark.parametrize(
    "raw",
    [
        "/x/../v1/completions",
        "/x/%2e%2e/v1/completions",
        "/x/%2E%2E/v1/completions",
        "/v1/./completions",
        "/v1%2fcompletions",
        "/v1%2Fcompletions",
        "//v1/completions",
        "/v1//completions",
        "/v1/completions/",
        "/v1/completions#x",
        "/v1/completions?a#b",
        "http://evil/v1/completions",
        "*",
        "/v1/compl\u00e9tions",
        "/v1/completions?a=\u00e9",
        "/v1/completions?a=%zz",
        "/v1/completions?a=b c",
        "/v1/com%70letions",
        "/v1/completions;x",
        "/v1\\completions",
    ],
)
def test_non_canonical_targets_are_refused(raw: str) -> None:
    with pytest.raises(FrontError) as info:
        canonical_target(raw)
    assert info.value.status == 400
    assert info.value.code == "invalid_request_target"


def test_canonical_target_keeps_the_query_verbatim() -> None:
    target = canonical_target("/v1/models?x=%2F&y")
    assert (target.path, target.query, target.raw) == (
        "/v1/models",
        "x=%2F&y",
        "/v1/models?x=%2F&y",
    )


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("POST", "/reset_prefix_cache", 403, "path_forbidden"),
        ("GET", "/v1/responses/resp_123", 403, "path_forbidden"),
        ("GET", "/metrics/x", 403, "path_forbidden"),
        ("POST", "/v1/nothing", 404, "route_not_found"),
        ("GET", "/v1/completions", 405, "method_not_allowed"),
        ("DELETE", "/v1/models", 405, "method_not_allowed"),
    ],
)
def test_route_refusals(method: str, path: str, status: int, code: str) -> None:
    with pytest.raises(FrontError) as info:
        check_route(method, path)
    assert (info.value.status, info.value.code) == (status, code)


segment = st.sampled_from(["v1", "completions", "chat", ".", "..", "", "%2e", "%2F", "a b", "é"])


@given(st.lists(segment, min_size=1, max_size=6), st.booleans())
def test_an_accepted_target_is_its_own_canonical_form(parts: list[str], slash: bool) -> None:
    raw = "/" + "/".join(parts) + ("/" if slash else "")
    refused: int | None = None
    try:
        target = canonical_target(raw)
    except FrontError as exc:
        refused = exc.status
    if refused is not None:
        assert refused == 400
        return
    assert target.raw == raw
    segments = target.path.split("/")[1:] if target.path != "/" else []
    assert all(s and s not in (".", "..") and "%" not in s for s in segments)
