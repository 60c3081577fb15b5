"""Every request field of the deployed vLLM through which a payload or engine state
enters, derived from vLLM's own request models (its wheel, read with `ast` as the route
table is), classified here; a new vLLM release adding one fails this test. And every route
whose request models (with what they inherit, through type aliases, and for `/invocations`
every model it dispatches to) can carry a prompt-embeds payload has each of those channels
verified by the front's route table (`tools.vllm_routes.request_models_in_wheel`).

Payload fields are verified by the front (`front.references`); state fields are refused
unless the deployment allows them (`VLLM_ENGINE_STATE_FIELDS`); the rest are listed with
the reason they carry neither a client payload nor other requests' state.
"""

from __future__ import annotations

import ast
import re
import zipfile
from collections.abc import Callable

import pytest
from multidict import CIMultiDict

from promptcache.contract import IsolationMode
from promptcache.contract.front import VLLM_ENGINE_STATE_FIELDS
from promptcache.front.references import CONVERSATION_FIELDS
from promptcache.front.settings import FrontSettings
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.policy import apply_policy
from promptcache.tenancy.routes import VLLM_ROUTES_VERSION, RouteClass, check_route, find_route
from tools import vllm_routes

SUSPECT = re.compile(
    r"embeds|previous_response|response_id|kv_transfer|xargs|extra_args|conversation"
    r"|background|store|state|resume|session"
)
"""Names that say "a payload the engine decodes" or "state beyond this request"."""

VERIFIED_PAYLOADS = {"prompt_embeds": "front.references: resolved and verified"}
ENGINE_STATE = set(VLLM_ENGINE_STATE_FIELDS)
NOT_A_CHANNEL = {
    "embed_dtype": "the output encoding of an embeddings answer",
    "embedding_types": "the output encoding of a Cohere embed answer",
    "conversations": "a render parameter (EncodeChatRenderParams), not a request field",
    "background": "Responses API: run in the background; the answer's id is what "
    "previous_response_id would name (refused)",
    "store": "Responses API: keep the answer; reachable again only by "
    "previous_response_id (refused)",
    "image_embeds": "multimodal embeds parts: vLLM refuses them without --enable-mm-embeds, "
    "which the renderer never sets",
    "audio_embeds": "as image_embeds",
    "video_embeds": "as image_embeds",
    "state": "StructuredDecisionRequest: the text the questions are about (prompt content)",
    "stream_state": "Derender*StreamRequest: the client's own detokenizer state, which it "
    "sends back with its next piece (held by the client, not the engine)",
}


def request_fields(wheel: str) -> dict[str, set[str]]:
    """Field name -> the request models (and content-part types) declaring it."""
    found: dict[str, set[str]] = {}
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if not name.endswith(".py") or not name.startswith(
                ("vllm/entrypoints/", "vllm/renderers/chat_utils/")
            ):
                continue
            for node in ast.walk(ast.parse(z.read(name))):
                if not isinstance(node, ast.ClassDef):
                    continue
                if not re.search(r"Request|Param|Message|Content|Part", node.name):
                    continue
                for stmt in node.body:
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                        found.setdefault(stmt.target.id, set()).add(node.name)
    return found


@pytest.fixture(scope="module")
def fields() -> dict[str, set[str]]:
    return request_fields(str(vllm_routes.ensure_wheel(VLLM_ROUTES_VERSION)))


def test_every_payload_or_state_field_is_classified(fields: dict[str, set[str]]) -> None:
    suspect = {name for name in fields if SUSPECT.search(name)}
    classified = set(VERIFIED_PAYLOADS) | ENGINE_STATE | set(NOT_A_CHANNEL)
    unclassified = {name: sorted(fields[name]) for name in suspect - classified}
    assert unclassified == {}, "classify these new vLLM request fields"


def test_the_classification_names_only_fields_vllm_has(fields: dict[str, set[str]]) -> None:
    assert set(VERIFIED_PAYLOADS) | ENGINE_STATE <= set(fields)


@pytest.mark.parametrize("field", VLLM_ENGINE_STATE_FIELDS)
@pytest.mark.parametrize("mode", list(IsolationMode))
def test_state_fields_are_refused_unless_allowed(field: str, mode: IsolationMode) -> None:
    route = check_route("POST", "/v1/chat/completions")
    headers = {"x-prompt-cache-isolation-key": "t"}
    secret = b"s" * 32
    with pytest.raises(FrontError) as caught:
        apply_policy(
            route, CIMultiDict(headers), {field: {"x": 1}}, FrontSettings(isolation_mode=mode),
            secret,
        )  # fmt: skip
    assert caught.value.code == "field_not_allowed"
    body: dict[str, object] = {field: None}
    apply_policy(route, CIMultiDict(headers), body, FrontSettings(isolation_mode=mode), secret)
    assert field not in body  # a null one is removed
    allowed = FrontSettings(isolation_mode=mode, allow_engine_state=True)
    body = {field: {"x": 1}}
    apply_policy(route, CIMultiDict(headers), body, allowed, secret)
    assert body[field] == {"x": 1}


SHAPE_READS: dict[str, Callable[[str], bool]] = {
    "completion": lambda channel: channel == "prompt_embeds",
    "chat": lambda channel: (
        channel.partition(":")[0] in CONVERSATION_FIELDS and channel.partition(":")[2] in ("1", "2")
    ),
}
SHAPE_READS["by_body"] = lambda channel: any(read(channel) for read in SHAPE_READS.values())
"""Which payload channels (`tools.vllm_routes.RequestModels.payload_channels`) each of the
front's embeds shapes verifies (`front.references.find_slots`): `chat` walks one
conversation or a list of them in each of `CONVERSATION_FIELDS`."""


@pytest.fixture(scope="module")
def models() -> vllm_routes.RequestModels:
    return vllm_routes.request_models_in_wheel(vllm_routes.ensure_wheel(VLLM_ROUTES_VERSION))


def test_the_derivation_reads_the_models_it_must(models: vllm_routes.RequestModels) -> None:
    # anchors: if the reading of vLLM's sources broke, these would be empty
    assert models.route_channels("POST", "/v1/completions") == {"prompt_embeds"}
    assert models.route_channels("POST", "/v1/chat/completions") == {"messages:1"}
    assert models.route_channels("POST", "/v1/chat/completions/batch") == {"messages:2"}
    assert {"prompt_embeds", "messages:1"} <= models.route_channels("POST", "/invocations")


def test_every_route_that_reads_a_payload_has_it_verified(
    models: vllm_routes.RequestModels,
) -> None:
    """For every route of the deployed vLLM whose request models can carry a prompt-embeds
    payload, the front's route verifies every channel. A new vLLM version with a new route
    reading chat messages, or a new field holding them, fails here."""
    unverified = {}
    for method, path in sorted(models.routes):
        channels = models.route_channels(method, path)
        if not channels:
            continue
        route = find_route(path)
        if route is not None and route.kind is RouteClass.REFUSED:
            continue  # never forwarded
        shape = route.embeds if route is not None else None
        missed = sorted(c for c in channels if shape is None or not SHAPE_READS[shape](c))
        if missed:
            unverified[f"{method} {path}"] = (shape, missed)
    assert unverified == {}


def test_every_route_with_engine_state_refuses_it(models: vllm_routes.RequestModels) -> None:
    """Engine-state fields are refused on every route whose request models declare one
    (the check is the policy's, route by route)."""
    secret = b"s" * 32
    checked = 0
    for method, path in sorted(models.routes):
        classes = models.classes(models.routes[(method, path)])
        state = {f for c in classes for f in models.all_fields(c)} & ENGINE_STATE
        route = find_route(path)
        if not state or route is None or route.kind is not RouteClass.SALTED:
            continue
        for name in sorted(state):
            with pytest.raises(FrontError) as caught:
                apply_policy(
                    route, CIMultiDict({"x-prompt-cache-isolation-key": "t"}), {name: {"x": 1}},
                    FrontSettings(isolation_mode=IsolationMode.PER_KEY), secret,
                )  # fmt: skip
            assert caught.value.code == "field_not_allowed", (path, name)
            checked += 1
    assert checked >= len(ENGINE_STATE)
