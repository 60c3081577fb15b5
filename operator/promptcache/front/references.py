"""Prompt embeds by reference: find them in a request, resolve, verify, cache.

The wire shapes (documented in docs/cache-front.md):

* `/v1/completions`: `prompt_embeds` is a string or a list of strings; each is
  a base64 payload or an identifier (`blake3:<64 hex>`; base64 never has `:`).
  A client that uploads payloads may name the identifiers it computed in
  `prompt_embeds_ids`, parallel to `prompt_embeds` (a string, or a list with
  `null` for entries it does not name).
* `/v1/chat/completions` (and every route reading chat messages: batched chat,
  render, tokenize, embeddings, pooling): a content part, or a message's
  `reasoning`, `{"type": "prompt_embeds", "data": X}` where X is a payload or an
  identifier; `"prompt_embeds_id"` beside `data` names the identifier of an
  uploaded payload.

The front removes its own fields (`prompt_embeds_ids`, `prompt_embeds_id`)
before vLLM sees the request, so vLLM gets exactly what it would have got
from a client that inlined every payload.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from promptcache.embeds.idsyntax import is_prompt_embeds_id
from promptcache.tenancy.canonical import dumps
from promptcache.tenancy.errors import (
    INVALID_PROMPT_EMBEDS,
    INVALID_PROMPT_EMBEDS_ID,
    PROMPT_EMBEDS_ID_MISMATCH,
    FrontError,
    not_cached,
)

COMPLETION_IDS_FIELD: Final = "prompt_embeds_ids"
CHAT_PART_ID_FIELD: Final = "prompt_embeds_id"
PROMPT_EMBEDS_FIELD: Final = "prompt_embeds"
CHAT_PART_TYPE: Final = "prompt_embeds"


class VerifiedLike(Protocol):
    """What resolution needs from a verified payload (see `verify.Verified`)."""

    @property
    def identifier(self) -> str: ...
    @property
    def turboquant(self) -> bool: ...
    @property
    def forward(self) -> str: ...


class CacheLike(Protocol):
    """The two methods of `promptcache.embeds.PromptEmbedsCache` the front calls."""

    def get(self, identifier: str, cache_salt: str | None = None) -> str | None: ...
    def put(self, identifier: str, payload: str, cache_salt: str | None = None) -> bool: ...


Verifier = Callable[[str], Awaitable[VerifiedLike]]
"""Runs `verify.verify_payload` off the event loop; raises `verify.PayloadError`."""


@dataclass(slots=True)
class Slot:
    """One place in a request's body holding a prompt-embeds payload or reference."""

    container: Any
    key: Any
    value: str
    named_id: str | None
    param: str


@dataclass(slots=True)
class Outcome:
    """What resolution did: metrics, and where the payloads now sit."""

    placed: list[tuple[Any, Any]] = field(default_factory=list)
    """(container, key) of every payload in the body, for `serialize`."""
    hits: int = 0
    misses: int = 0
    uploads_verified: int = 0
    uploads_rejected: int = 0
    stored: int = 0
    bytes_saved: int = 0
    slots: int = 0
    missing: list[str] = field(default_factory=list)


class KindIndex:
    """What the front learnt from payloads it verified, to avoid verifying them twice.

    Two bounded LRU maps: identifier → is-TurboQuant (a dense hit then needs no
    decode), and `hash(payload text)` → identifier (an unnamed re-upload then
    finds its identifier without a `torch.load`). Neither is trusted alone: a
    payload is only taken as verified when it is string-equal to the cached,
    verified payload; forgetting an entry costs one extra decode, never a wrong
    answer.


    Both are keyed by the request's cache scope too: what one tenant uploaded
    must not change what another tenant's request does (not even whether the
    cache is consulted, which `/metrics` counts), or the index would tell
    tenants which payloads others have sent.
    """

    def __init__(self, capacity: int = 100_000) -> None:
        self._capacity = capacity
        self._kinds: OrderedDict[tuple[str | None, str], bool] = OrderedDict()
        self._by_text: OrderedDict[tuple[str | None, int], str] = OrderedDict()

    def get(self, identifier: str, scope: str | None = None) -> bool | None:
        key = (scope, identifier)
        kind = self._kinds.get(key)
        if kind is not None:
            self._kinds.move_to_end(key)
        return kind

    def set(
        self,
        identifier: str,
        turboquant: bool,
        payload: str | None = None,
        scope: str | None = None,
    ) -> None:
        key = (scope, identifier)
        self._kinds[key] = turboquant
        self._kinds.move_to_end(key)
        while len(self._kinds) > self._capacity:
            self._kinds.popitem(last=False)
        if payload is not None:
            text_key = (scope, hash(payload))
            self._by_text[text_key] = identifier
            self._by_text.move_to_end(text_key)
            while len(self._by_text) > self._capacity:
                self._by_text.popitem(last=False)

    def identifier_of(self, payload: str, scope: str | None = None) -> str | None:
        """The identifier a payload with this text had when it was verified, if known."""
        return self._by_text.get((scope, hash(payload)))


def _bad_id(param: str, value: object) -> FrontError:
    shown = repr(value)[:80]
    return FrontError(
        400,
        INVALID_PROMPT_EMBEDS_ID,
        f"{param} is not a prompt-embeds identifier: expected 'blake3:' followed by 64 "
        f"lowercase hex digits, got {shown}",
        param=param,
    )


def _named_id(param: str, value: object) -> str | None:
    if value is None:
        return None
    if not is_prompt_embeds_id(value):
        raise _bad_id(param, value)
    return value


def _completion_slots(body: dict[str, Any]) -> list[Slot]:
    embeds = body.get(PROMPT_EMBEDS_FIELD)
    ids = body.pop(COMPLETION_IDS_FIELD, None)
    if embeds is None:
        if ids is not None:
            raise FrontError(
                400,
                INVALID_PROMPT_EMBEDS_ID,
                f"{COMPLETION_IDS_FIELD} names identifiers but the request has no "
                f"{PROMPT_EMBEDS_FIELD}",
                param=COMPLETION_IDS_FIELD,
            )
        return []
    if isinstance(embeds, str):
        if ids is not None and not isinstance(ids, str):
            raise FrontError(
                400,
                INVALID_PROMPT_EMBEDS_ID,
                f"{COMPLETION_IDS_FIELD} must be a string when {PROMPT_EMBEDS_FIELD} is one",
                param=COMPLETION_IDS_FIELD,
            )
        named = _named_id(COMPLETION_IDS_FIELD, ids)
        return [Slot(body, PROMPT_EMBEDS_FIELD, embeds, named, PROMPT_EMBEDS_FIELD)]
    if not isinstance(embeds, list) or not all(isinstance(e, str) for e in embeds):
        raise FrontError(
            400,
            INVALID_PROMPT_EMBEDS,
            f"{PROMPT_EMBEDS_FIELD} must be a string or a list of strings",
            param=PROMPT_EMBEDS_FIELD,
        )
    if ids is not None and (not isinstance(ids, list) or len(ids) != len(embeds)):
        raise FrontError(
            400,
            INVALID_PROMPT_EMBEDS_ID,
            f"{COMPLETION_IDS_FIELD} must be a list as long as {PROMPT_EMBEDS_FIELD} "
            f"({len(embeds)} entries), with null where no identifier is named",
            param=COMPLETION_IDS_FIELD,
        )
    slots = []
    for i, value in enumerate(embeds):
        named = _named_id(f"{COMPLETION_IDS_FIELD}[{i}]", ids[i] if ids is not None else None)
        slots.append(Slot(embeds, i, value, named, f"{PROMPT_EMBEDS_FIELD}[{i}]"))
    return slots


CONVERSATION_FIELDS: Final = ("messages", "input")
"""Top-level fields vLLM reads chat messages from: `messages` (chat, batched chat, the
pooling and tokenize chat requests), and `input` (embeddings accept a conversation there
when `messages` is absent). Each holds one conversation or a list of them."""
REASONING_FIELDS: Final = ("reasoning", "reasoning_content")
"""A message's reasoning may be a prompt-embeds part (vLLM moves `reasoning_content` to
`reasoning` when the latter is absent)."""


def _conversations(body: dict[str, Any]) -> list[tuple[str, list[Any]]]:
    """Every conversation (a list of messages) in the body's conversation fields, with
    the parameter path that names it."""
    found: list[tuple[str, list[Any]]] = []
    for name in CONVERSATION_FIELDS:
        value = body.get(name)
        if not isinstance(value, list):
            continue
        if any(isinstance(item, list) for item in value):  # a batch of conversations
            found += [(f"{name}[{i}]", c) for i, c in enumerate(value) if isinstance(c, list)]
        else:
            found.append((name, value))
    return found


def _part_slot(part: Any, param: str) -> Slot | None:
    """The slot of one `{"type": "prompt_embeds", "data": ...}` part, if it is one."""
    if not isinstance(part, dict) or part.get("type") != CHAT_PART_TYPE:
        return None
    named = _named_id(f"{param}.{CHAT_PART_ID_FIELD}", part.pop(CHAT_PART_ID_FIELD, None))
    data = part.get("data")
    if not isinstance(data, str):
        if named is None:
            raise FrontError(
                400,
                INVALID_PROMPT_EMBEDS,
                f"{param}.data must be a base64 payload or a prompt-embeds identifier",
                param=f"{param}.data",
            )
        data = named  # an identifier given only by name is a reference
        part["data"] = data
    return Slot(part, "data", data, named, f"{param}.data")


def _chat_slots(body: dict[str, Any]) -> list[Slot]:
    """Prompt-embeds parts in every message's content and reasoning, in every
    conversation the body holds (vLLM 0.33's chat message readers, `renderers/chat_utils`)."""
    slots = []
    for where, messages in _conversations(body):
        for m, message in enumerate(messages):
            if not isinstance(message, dict):
                continue  # vLLM reports malformed messages itself
            content = message.get("content")
            for p, part in enumerate(content if isinstance(content, list) else ()):
                slot = _part_slot(part, f"{where}[{m}].content[{p}]")
                if slot is not None:
                    slots.append(slot)
            for name in REASONING_FIELDS:
                slot = _part_slot(message.get(name), f"{where}[{m}].{name}")
                if slot is not None:
                    slots.append(slot)
    return slots


def find_slots(shape: str | None, body: dict[str, Any]) -> list[Slot]:
    """Every place in the request where a prompt-embeds payload or reference sits.

    `shape` is the route's (`routes.Route.embeds`): `completion` (top-level
    `prompt_embeds`), `chat` (parts of the messages of every conversation), or `by_body`
    for `/invocations`, which vLLM dispatches to the first request model the body
    validates as (chat, then completions, then the pooling ones): both are looked at,
    since a body with `messages` may still be read as a completion.
    """
    if shape == "by_body":
        return _completion_slots(body) + _chat_slots(body)
    if shape == "completion":
        return _completion_slots(body)
    if shape == "chat":
        return _chat_slots(body)
    return []


def _is_reference(value: str) -> bool:
    # base64 never contains ':', so anything with one claims to be an identifier
    return ":" in value


@dataclass(frozen=True, slots=True)
class _Known:
    identifier: str
    turboquant: bool
    forward: str


def _already_verified(
    slot: Slot, cache: CacheLike | None, scope: str | None, kinds: KindIndex
) -> _Known | None:
    """A dense upload identical to what this scope already holds under its identifier.

    The cached string was verified to hash to that identifier when it was stored,
    so an exact string match needs no second torch.load: a client that re-sends
    payloads costs a lookup and a comparison, not a decode. The identifier is the
    one the client named, or the one this text had when it was last verified.
    """
    if cache is None:
        return None
    identifier = slot.named_id or kinds.identifier_of(slot.value, scope)
    if identifier is None or kinds.get(identifier, scope) is not False:
        return None
    if cache.get(identifier, scope) != slot.value:
        return None
    return _Known(identifier=identifier, turboquant=False, forward=slot.value)


async def resolve(
    slots: list[Slot],
    *,
    cache: CacheLike | None,
    scope: str | None,
    verifier: Verifier,
    kinds: KindIndex,
    max_slots: int = 1024,
) -> Outcome:
    """Replace every reference with its payload and verify every upload, in place.

    `slots`: where the body holds them (`find_slots`, run where the body was parsed).
    `cache` is None when this request may not use the cache (disabled, or
    prompt_cache_max_len 0). Raises `FrontError`: 409 with the missing
    identifiers, 400 for a bad identifier, a bad payload or an id mismatch.
    Nothing is stored unless the whole request verified.
    """
    outcome = Outcome()
    outcome.slots = len(slots)
    if not slots:
        return outcome
    if len(slots) > max_slots:
        raise FrontError(
            400,
            INVALID_PROMPT_EMBEDS,
            f"the request carries {len(slots)} prompt-embeds payloads or references; this "
            f"server accepts at most {max_slots} in one request",
            param=slots[0].param.split("[")[0],
        )
    hits, uploads = _look_up(slots, cache, scope, outcome)
    verified = await _verify_uploads(
        uploads, cache=cache, scope=scope, verifier=verifier, kinds=kinds, outcome=outcome
    )
    outcome.placed = [(slot.container, slot.key) for slot in slots]
    for slot, result in verified:
        slot.container[slot.key] = result.forward
        kinds.set(result.identifier, result.turboquant, slot.value, scope)
        if cache is not None and cache.put(result.identifier, slot.value, scope):
            outcome.stored += 1
    densified: dict[str, str] = {}
    for slot, payload in hits:
        if kinds.get(slot.value, scope) is False:
            slot.container[slot.key] = payload
            continue
        # TurboQuant, or forgotten: derive the dense form again, once per identifier
        dense = densified.get(slot.value)
        if dense is None:
            result = await verifier(payload)
            kinds.set(result.identifier, result.turboquant, None, scope)
            dense = densified[slot.value] = result.forward
        slot.container[slot.key] = dense
    return outcome


def _look_up(
    slots: list[Slot], cache: CacheLike | None, scope: str | None, outcome: Outcome
) -> tuple[list[tuple[Slot, str]], list[Slot]]:
    """Split slots into cache hits and uploads; any miss raises the 409."""
    hits: list[tuple[Slot, str]] = []
    uploads: list[Slot] = []
    missing: dict[str, None] = {}  # ordered and O(1): thousands of ids stay linear
    found: dict[str, str | None] = {}
    for slot in slots:
        if not _is_reference(slot.value):
            uploads.append(slot)
            continue
        if not is_prompt_embeds_id(slot.value):
            raise _bad_id(slot.param, slot.value)
        if slot.named_id is not None and slot.named_id != slot.value:
            raise FrontError(
                400,
                PROMPT_EMBEDS_ID_MISMATCH,
                f"{slot.param} references {slot.value} but names {slot.named_id}",
                param=slot.param,
            )
        if slot.value in found:
            payload = found[slot.value]
        else:
            payload = cache.get(slot.value, scope) if cache is not None else None
            found[slot.value] = payload
        if payload is None:
            missing[slot.value] = None
            outcome.misses += 1
        else:
            hits.append((slot, payload))
            outcome.hits += 1
            outcome.bytes_saved += len(payload) - len(slot.value)
    if missing:
        outcome.missing = list(missing)
        raise not_cached(outcome.missing, slots[0].param.split("[")[0])
    return hits, uploads


async def _verify_uploads(
    uploads: list[Slot],
    *,
    cache: CacheLike | None,
    scope: str | None,
    verifier: Verifier,
    kinds: KindIndex,
    outcome: Outcome,
) -> list[tuple[Slot, VerifiedLike]]:
    """Verify every uploaded payload (all before any is stored)."""
    verified: list[tuple[Slot, VerifiedLike]] = []
    for slot in uploads:
        known = _already_verified(slot, cache, scope, kinds)
        if known is not None:
            verified.append((slot, known))
            continue
        try:
            result = await verifier(slot.value)
        except ValueError as exc:
            outcome.uploads_rejected += 1
            raise FrontError(
                400, INVALID_PROMPT_EMBEDS, f"{slot.param} {exc}", param=slot.param
            ) from None
        if slot.named_id is not None and slot.named_id != result.identifier:
            outcome.uploads_rejected += 1
            raise FrontError(
                400,
                PROMPT_EMBEDS_ID_MISMATCH,
                f"{slot.param} hashes to {result.identifier}, not to the identifier the "
                f"client named ({slot.named_id}); nothing was cached",
                param=slot.param,
            )
        verified.append((slot, result))
    outcome.uploads_verified = len(verified)
    return verified


_BASE64_ALPHABET: Final = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="


def _as_plain_json_text(value: object) -> bytes | None:
    """The ASCII bytes of a string JSON encodes verbatim (base64), else None."""
    if not isinstance(value, str) or not value.isascii():
        return None
    raw = value.encode("ascii")
    return raw if not raw.translate(None, _BASE64_ALPHABET) else None


def serialize(
    body: dict[str, Any], placed: list[tuple[Any, Any]], *, interruptible: bool = False
) -> bytes:
    """`json.dumps(body)` compactly, without running the encoder over the payloads.

    Payloads are most of a request's bytes and are base64, which JSON encodes
    verbatim: each is swapped for a short placeholder, the small rest is
    encoded, and the payloads are spliced back in. The result is byte for byte
    what `json.dumps(body, ensure_ascii=False, separators=(",", ":"))` gives, at
    a fraction of the cost on large bodies; anything not base64 is left to the
    encoder. `interruptible`: the pure-Python encoder (`tenancy.canonical.dumps`), for bodies
    dense in values worked on off the event loop.
    """
    payloads: list[bytes] = []
    originals: list[str] = []
    index: dict[int, int] = {}  # one encoded copy per distinct payload object
    marker = f"promptcache-slot-{secrets.token_hex(8)}-"
    for container, key in placed:
        value = container[key]
        n = index.get(id(value))
        if n is None:
            raw = _as_plain_json_text(value)
            if raw is None:
                continue
            n = index[id(value)] = len(payloads)
            payloads.append(raw)
        originals.append(value)
        container[key] = f"{marker}{n}:{len(originals) - 1}"
    try:
        text = dumps(body, interruptible=interruptible)
    finally:
        for container, key in placed:
            value = container[key]
            if isinstance(value, str) and value.startswith(marker):
                container[key] = originals[int(value.rpartition(":")[2])]
    if not payloads:
        return text.encode("utf-8")
    pieces = text.split(f'"{marker}')
    out = [pieces[0].encode("utf-8")]
    for piece in pieces[1:]:
        slot, _, rest = piece.partition('"')
        out.extend((b'"', payloads[int(slot.partition(":")[0])], b'"', rest.encode("utf-8")))
    return b"".join(out)


def splice(encoded: bytes, marker: str, values: list[str]) -> bytes:
    """`encoded` (JSON whose strings `marker` + index stand for prompt-embeds slots) with
    each such string replaced by the JSON string of `values[index]`, verbatim when it is
    base64 (as `serialize` writes it)."""
    if not values:
        return encoded
    pieces = encoded.split(f'"{marker}'.encode())
    out = [pieces[0]]
    for piece in pieces[1:]:
        index, _, rest = piece.partition(b'"')
        value = values[int(index)]
        raw = _as_plain_json_text(value)
        out.append(b'"' + raw + b'"' if raw is not None else dumps(value).encode("utf-8"))
        out.append(rest)
    return b"".join(out)


def forward_size(placed: list[tuple[Any, Any]]) -> int:
    """Bytes the payloads will take in the forwarded body, every reference counted in full.

    Known before `serialize` builds anything, so a request whose references
    expand past the limits is refused before it is materialised.
    """
    return sum(len(c[k]) for c, k in placed if isinstance(c[k], str))
