"""Every request field of the deployed vLLM through which a payload or engine state
enters, derived from vLLM's own request models (its wheel, read with `ast` as the route
table is), classified here; a new vLLM release adding one fails this test.

Payload fields are verified by the front (`front.references`); state fields are refused
unless the deployment allows them (`VLLM_ENGINE_STATE_FIELDS`); the rest are listed with
the reason they carry neither a client payload nor other requests' state.
"""

from __future__ import annotations

import ast
import re
import zipfile

import pytest
from multidict import CIMultiDict

from promptcache.contract import IsolationMode
from promptcache.contract.front import VLLM_ENGINE_STATE_FIELDS
from promptcache.front.settings import FrontSettings
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.policy import apply_policy
from promptcache.tenancy.routes import VLLM_ROUTES_VERSION, check_route
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
