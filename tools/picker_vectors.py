#!/usr/bin/env python3
"""The test vectors that hold the picker's Go port (`picker/tenancy`) to the Python tenancy.

The salt, the key grammar and limits, the account digest, the signed identity header and
its body digest, and the whole gateway decision are defined in Python
(`promptcache.tenancy`, `promptcache.gateway.decision.decide`); so are the session a
request names and the session plugin's type and parameters (`promptcache.contract.session`,
read by `picker/sessions` and `picker/plugins/sessionaffinity`). This script computes
vectors from those functions into ``picker/testvectors/vectors.json`` and writes the route
table the Go side classifies requests with (``picker/tenancy/routes_table.go``);
``go test ./...`` in ``picker/`` reads the vectors, and
``tests/tenancy/test_picker_vectors.py`` fails when either file is stale. A change to one
side the other does not follow cannot land.

Usage::

    python tools/picker_vectors.py           # regenerate
    python tools/picker_vectors.py --check   # exit 1 naming each stale file
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from multidict import CIMultiDict

from promptcache.contract import (
    IDENTITY_ATTESTATION_HEADER,
    MAX_SESSION_ID_CHARS,
    PREDICTED_MATCH_HEADER,
    PREDICTED_MATCH_PLUGIN,
    SESSION_AFFINITY_PLUGIN,
    TENANT_SALT_PARSER,
    IsolationMode,
    PickerFlag,
    PredictedMatchParam,
    SessionParam,
    SessionSource,
    TenantSaltParam,
    request_session,
    session_sources,
)
from promptcache.contract.gateway_policy import MAX_GATEWAY_POLICY_DRAIN_SECONDS
from promptcache.gateway.decision import decide
from promptcache.runtime.refusals import body_timeout, too_large
from promptcache.tenancy import attestation, identity, prediction, salt
from promptcache.tenancy.canonical import header_multidict, parse_body
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.policy import MAX_ISOLATION_KEY_CHARS
from promptcache.tenancy.prediction import Prediction
from promptcache.tenancy.routes import ROUTES, RouteClass
from promptcache.tenancy.settings import MIN_SALT_KEY_BYTES, PolicySettings

ROOT = Path(__file__).resolve().parent.parent
VECTORS = ROOT / "picker" / "testvectors" / "vectors.json"
PREDICTION_VECTORS = ROOT / "picker" / "testvectors" / "prediction_vectors.json"
ROUTE_TABLE = ROOT / "picker" / "tenancy" / "routes_table.go"

SECRET = b"vectors-salt-key-0123456789abcdef"
NOW = 1_800_000_000
NONCE = bytes(range(12))
KEY_HEADER = "x-prompt-cache-isolation-key"
KEY_FIELD = "prompt_cache_isolation_key"
ID_HEADER = "x-user"

KEYS: list[str] = [
    "tenant-a",
    "",
    " spaced ",
    "nul\0inside",
    "caf\u00e9",
    "\U0001f600 emoji",
    "<html>&amp;",
    "\u212aelvin",
    "\ufffd",
    "x" * MAX_ISOLATION_KEY_CHARS,
    "\u00e9" * MAX_ISOLATION_KEY_CHARS,
]


def _salts() -> list[dict[str, Any]]:
    return [{"key": k, "salt": salt.derive_salt(SECRET, k)} for k in KEYS]


def _account_salts() -> list[dict[str, Any]]:
    account = identity.account_digest(SECRET, "header", "alice")
    out = []
    for k in [None, *KEYS[:6]]:
        out.append(
            {
                "account": account.hex(),
                "key": k,
                "salt": salt.derive_account_salt(SECRET, account, k),
            }
        )
    return out


def _account_digests() -> list[dict[str, Any]]:
    values = ["alice", "Alice", " alice", "caf\u00e9", "a" * 1024, "tok+/=="]
    return [
        {"source": src, "value": v, "digest": identity.account_digest(SECRET, src, v).hex()}
        for src in ("header", "bearer")
        for v in values
    ]


def _identities() -> list[dict[str, Any]]:
    """What header_identity / bearer_identity make of one header value (hex: raw bytes)."""
    header_values = [
        "alice", "  alice\t", "", "   ", "al ice", "a" * 1024, "a" * 1025,
        "\u00e9" * 1024, "\u00e9" * 1025, "bad\x01", "bad\x7f", "caf\u00e9",
    ]  # fmt: skip
    bearer_values = [
        "Bearer abc", "bearer abc", "BEARER  abc ", "Bearer\tabc", "Bearer", "Bearer ",
        "Basic abc", "Bearer a b", "Bearer a\"b", "Bearer abc==", "Bearer abc=d",
        "Bearer " + "a" * 1024, "Bearer " + "a" * 1025, "Token abc", "bearer tok+/~._-",
    ]  # fmt: skip
    out: list[dict[str, Any]] = []
    for kind, values in (("header", header_values), ("bearer", bearer_values)):
        for v in values:
            headers = CIMultiDict({ID_HEADER if kind == "header" else "authorization": v})
            try:
                if kind == "header":
                    got = identity.header_identity(headers, ID_HEADER)
                else:
                    got = identity.bearer_identity(headers)
                out.append({"kind": kind, "value": v, "identity": got, "code": None})
            except FrontError as e:
                out.append({"kind": kind, "value": v, "identity": None, "code": e.code})
    return out


def _salt_keys() -> list[dict[str, Any]]:
    raws = [
        SECRET,
        b"  " + SECRET + b"\n",
        b"\t\r\v\f" + SECRET + b" \n",
        b"\xc2\xa0" + SECRET + b"\xc2\x85",  # NBSP and NEL: Python's bytes.strip keeps them
        b"short-key\n",
        b" " + b"k" * (MIN_SALT_KEY_BYTES - 1) + b" ",
        b"k" * MIN_SALT_KEY_BYTES,
    ]
    out = []
    for raw in raws:
        kept = raw.strip()
        ok = len(kept) >= MIN_SALT_KEY_BYTES
        out.append({"raw": _bytes(raw), "secret": kept.hex() if ok else None})
    return out


BODY_DIGEST_BODIES: list[bytes] = [
    b'{"model":"m","prompt":"hi"}',
    b'{"prompt":"hi","model":"other"}',
    b'{"b":1,"a":2,"c":{"z":1,"y":[3,2,1]}}',
    b'{"n":[0,-0,1,100,1.0,-1.5,0.1,1e16,1e15,123456789012345678,12345678901234567890,'
    b"1e21,1e22,0.0001,0.00001,1e-7,5e-324,1.7976931348623157e308,-0.0,2.5e-5,1e100,"
    b"0.30000000000000004,9007199254740993,3.0e2,1E3]}",
    b'{"html":"<script>&amp;</script>","ls":"\\u2028\\u2029","ctl":"\\u0000\\u0001\\b\\f\\n\\r\\t\\u001f\\u007f"}',
    b'{"q":"\\"quoted\\" back\\\\slash /slash \\/",'
    b'"u":"caf\\u00e9 \xc3\xa9 \\ud83d\\ude00 \xf0\x9f\x98\x80"}',
    b'{"t":true,"f":false,"z":null,"e":{},"a":[]}',
    '{"\uffff":1,"\U0001f600":2,"\u00e9":3,"e":4,"f":5}'.encode(),
    b'{"cache_salt":"pck1-x","messages":[{"role":"user","content":"hi"}],"max_tokens":16}',
]


def _body_digests() -> list[dict[str, Any]]:
    return [
        {"body": _bytes(raw), "digest": attestation.body_digest(parse_body(raw, acted_on=())).hex()}
        for raw in BODY_DIGEST_BODIES
    ]


def _attestations() -> dict[str, Any]:
    key = attestation.attestation_key(SECRET)
    account = identity.Account(identity.account_digest(SECRET, "header", "alice"))
    digest = attestation.body_digest({"prompt": "hi"})
    key_sets: list[list[str]] = [[], ["tenant-a"], ["b", "a", "b"], ["caf\u00e9"], ["\0"]]
    signs = [
        {
            "key_values": kv,
            "binding": attestation.key_binding(kv).hex(),
            "value": attestation.sign(
                key, account, key_values=kv, digest=digest, now=NOW, nonce=NONCE
            ),
        }
        for kv in key_sets
    ]
    return {
        "key": key.hex(),
        "account": account.digest.hex(),
        "account_text": account.text,
        "digest": digest.hex(),
        "now": NOW,
        "nonce": NONCE.hex(),
        "sign": signs,
    }


SETTINGS: dict[str, dict[str, Any]] = {
    "shared": {"isolation_mode": IsolationMode.SHARED},
    "perkey": {"isolation_mode": IsolationMode.PER_KEY},
    "perkey-header-only": {"isolation_mode": IsolationMode.PER_KEY, "isolation_field": ""},
    "perkey-field-only": {"isolation_mode": IsolationMode.PER_KEY, "isolation_header": ""},
    "perkey-no-max-len": {
        "isolation_mode": IsolationMode.PER_KEY,
        "honor_prompt_cache_max_len": False,
    },
    "required": {"isolation_mode": IsolationMode.REQUIRED},
    "required-engine-state": {
        "isolation_mode": IsolationMode.REQUIRED,
        "allow_engine_state": True,
        "allow_client_priority": True,
    },
    "account-header": {"isolation_mode": IsolationMode.PER_KEY, "identity_header": ID_HEADER},
    "account-bearer": {"isolation_mode": IsolationMode.PER_KEY, "identity_bearer": True},
    "account-required": {
        "isolation_mode": IsolationMode.REQUIRED,
        "identity_header": ID_HEADER,
        "identity_bearer": True,
        "identity_required": True,
    },
}

LONG_SETTINGS = ("perkey", "account-header")
CHAT = "/v1/chat/completions"
MSG = b'"messages":[{"role":"user","content":"hi"}]'


def _bytes(raw: bytes) -> str | dict[str, str]:
    """Bytes in the vectors: a JSON string when they are UTF-8, else {"hex": ...}."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": raw.hex()}


def _obj(*members: bytes) -> bytes:
    return b"{" + b",".join(members) + b"}"


Request = tuple[str, str, list[tuple[str, bytes]], bytes]
"""(label, [method ]path, extra headers, body)."""
MODEL = b'"model":"m"'
BASE = _obj(MODEL, MSG)


def _with(*members: bytes) -> bytes:
    """The ordinary chat body plus `members`."""
    return _obj(MODEL, MSG, *members)


def _key_field(raw: bytes) -> bytes:
    return _with(b'"' + KEY_FIELD.encode() + b'":' + raw)


def _content(raw: bytes) -> bytes:
    return _obj(MODEL, b'"messages":[{"role":"user","content":"' + raw + b'"}]')


def _key_requests() -> Iterator[Request]:
    """Keys from header and field, the length limit in code points, NUL, bad Unicode."""
    for i, k in enumerate(KEYS):
        yield f"key-header-{i}", CHAT, [(KEY_HEADER, k.encode())], BASE
        yield f"key-field-{i}", CHAT, [], _key_field(json.dumps(k).encode())
    emoji, e_acute = "\U0001f600".encode(), "\u00e9".encode()
    yield "key-too-long", CHAT, [(KEY_HEADER, b"x" * (MAX_ISOLATION_KEY_CHARS + 1))], BASE
    yield "key-too-long-2byte", CHAT, [], _key_field(b'"' + e_acute * 4097 + b'"')
    yield "key-too-long-astral", CHAT, [], _key_field(b'"' + emoji * 4097 + b'"')
    yield "key-astral-at-limit", CHAT, [], _key_field(b'"' + emoji * 4096 + b'"')
    yield "key-escaped-pair", CHAT, [], _key_field(b'"\\ud83d\\ude00x"')
    yield "key-both-same", CHAT, [(KEY_HEADER, b"t")], _key_field(b'"t"')
    yield "key-both-differ", CHAT, [(KEY_HEADER, b"t")], _key_field(b'"u"')
    yield "key-field-null", CHAT, [], _key_field(b"null")
    yield "key-field-number", CHAT, [], _key_field(b"12")
    yield "key-field-lone", CHAT, [], _key_field(b'"a\\ud800"')
    yield "key-header-invalid-utf8", CHAT, [(KEY_HEADER, b"\xff\xfe")], BASE
    yield "key-header-nul", CHAT, [(KEY_HEADER, b"a\0b")], BASE


def _body_requests() -> Iterator[Request]:
    """What Go's encoding/json reads differently from Python's json."""
    yield "plain", CHAT, [], BASE
    yield "completions", "/v1/completions", [], _obj(MODEL, b'"prompt":"hi"')
    yield "client-salt", CHAT, [], _with(b'"cache_salt":"pck1-forged"')
    yield "invalid-utf8-body", CHAT, [], _content(b"\xff")
    yield "bom", CHAT, [], b"\xef\xbb\xbf" + BASE
    yield "lone-surrogate-prompt", CHAT, [], _content(b"\\udc00")
    yield "nul-escape", CHAT, [], _content(b"a\\u0000b")
    yield "raw-control", CHAT, [], _content(b"a\x01b")
    yield "dup-top", CHAT, [], _with(b'"x":1,"x":2')
    yield "dup-nested", CHAT, [], _obj(MODEL, b'"messages":[{"role":"user","role":"user"}]')
    yield "dup-salt", CHAT, [], _with(b'"cache_salt":"a","cache_salt":"b"')
    yield "fold-salt", CHAT, [], _with(b'"CACHE_SALT":"x"')
    yield "fold-long-s", CHAT, [], _with(b'"cache_\\u017falt":"x"')
    yield "fold-kelvin", CHAT, [], _with(b'"prompt_cache_\\u212aey":"x"')
    yield "fold-key-field", CHAT, [], _with(b'"Prompt_Cache_Isolation_Key":"x"')
    yield "fold-two-unknown", CHAT, [], _with(b'"foo":1,"FOO":2')
    yield "not-object", CHAT, [], b"[1,2]"
    yield "not-json", CHAT, [], b"{nope"
    yield "trailing", CHAT, [], BASE + b" x"
    yield "nan", CHAT, [], _with(b'"t":NaN')
    yield "inf-float", CHAT, [], _with(b'"t":1e400')
    yield (
        "html-numbers",
        CHAT,
        [(KEY_HEADER, b"t")],
        _obj(
            MODEL,
            b'"messages":[{"role":"user","content":"<b>&amp;</b> \\u2028"}]',
            b'"max_tokens":16,"temperature":0.7,"n":1e16,"m":-0.0,"k":100',
        ),
    )


def _field_requests() -> Iterator[Request]:
    """The policy's fields, each in the forms vLLM's lax reading accepts and refuses."""
    for v in (b"0", b"-0", b"5", b"0.0", b"-1", b"true", b'"0"', b"null", b"1e2"):
        yield (
            f"max-len-{v.decode()}",
            CHAT,
            [(KEY_HEADER, b"t")],
            _with(b'"prompt_cache_max_len":' + v),
        )
    cohere = _with(b'"prompt_cache_max_len":0')
    yield "max-len-0-cohere", "/cohere/v2/chat", [(KEY_HEADER, b"t")], cohere
    for v in (b"0", b"3", b"0.0", b'"0"', b'" 0 "', b'"x"', b"false", b"true", b"null", b"0.5"):
        yield f"priority-{v.decode()}", CHAT, [], _with(b'"priority":' + v)
    yield "engine-state", CHAT, [], _with(b'"kv_transfer_params":{}')
    yield "engine-state-null", CHAT, [], _with(b'"vllm_xargs":null')
    for v in (b"true", b'"yes"', b"1", b"2", b'"maybe"', b"1.0", b"null"):
        yield f"stream-{v.decode()}", CHAT, [], _with(b'"stream":' + v)
    yield "stream-options-list", CHAT, [], _with(b'"stream_options":[]')
    yield "stream-options-bad", CHAT, [], _with(b'"stream_options":{"include_usage":"x"}')
    yield "user-control", CHAT, [], _with(b'"user":"a\\nb"')
    yield "user-ok", CHAT, [], _with(b'"user":"alice"')


def _route_requests() -> Iterator[Request]:
    """Request targets, routes, methods and the head's headers."""
    yield "content-type", CHAT, [("content-type", b"text/plain")], BASE
    yield "content-type-params", CHAT, [("content-type", b"Application/JSON; charset=utf-8")], BASE
    yield "gzip", CHAT, [("content-encoding", b"gzip")], BASE
    yield "route-forbidden", "/reset_prefix_cache", [], BASE
    yield "route-unknown", "/v1/nope", [], BASE
    yield "route-read-only", "/v1/models", [], BASE
    yield "route-noncanonical", "/v1//chat/completions", [], BASE
    yield "route-dot", "/v1/./chat/completions", [], BASE
    yield "route-query", CHAT + "?a=b%20c", [], BASE
    yield "route-bad-query", CHAT + "?a b", [], BASE
    yield "route-no-salt", "/cohere/v2/chat", [], BASE
    yield "route-tokenize", "/tokenize", [(KEY_HEADER, b"t")], BASE
    yield "route-embeddings", "/v1/embeddings", [(KEY_HEADER, b"t")], _obj(MODEL, b'"input":"x"')
    yield "route-templated", "/v1/responses/abc", [], BASE
    yield "method-get", "GET " + CHAT, [], BASE


def _identity_requests() -> Iterator[Request]:
    """The account from the identity header or the bearer token."""
    yield "id-header", CHAT, [(ID_HEADER, b"alice")], BASE
    yield "id-header-key", CHAT, [(ID_HEADER, b" alice "), (KEY_HEADER, b"t")], BASE
    yield "id-header-long", CHAT, [(ID_HEADER, b"a" * 1025)], BASE
    yield "id-header-control", CHAT, [(ID_HEADER, b"a\x01")], BASE
    yield "id-bearer", CHAT, [("authorization", b"Bearer tok-1")], BASE
    yield "id-bearer-bad", CHAT, [("authorization", b"Bearer a b")], BASE
    yield "id-basic", CHAT, [("authorization", b"Basic abc")], BASE
    yield "id-both", CHAT, [(ID_HEADER, b"alice"), ("authorization", b"Bearer tok-1")], BASE
    yield "id-forged-attestation", CHAT, [("x-promptcache-identity", b"v1.1.x.y.z")], BASE
    yield "id-html-body", CHAT, [(ID_HEADER, b"alice")], _with(b'"x":"<&>","n":[1,1.5,1e16]')


def _requests() -> Iterator[Request]:
    yield from _body_requests()
    yield from _key_requests()
    yield from _field_requests()
    yield from _route_requests()
    yield from _identity_requests()


def _decisions() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for (name, overrides), req in itertools.product(SETTINGS.items(), _requests()):
        label, target, extra, raw = req
        if len(raw) + sum(len(v) for _, v in extra) > 2048 and name not in LONG_SETTINGS:
            continue  # the long keys under two settings keep the file small
        method, _, path = target.rpartition(" ")
        policy = PolicySettings(**overrides)
        secret = SECRET if policy.isolation_mode is not IsolationMode.SHARED else None
        entries: list[tuple[str, bytes]] = [
            (":method", (method or "POST").encode()),
            (":path", path.encode()),
        ]
        if not any(k == "content-type" for k, _ in extra):
            entries.append(("content-type", b"application/json"))
        entries += extra
        headers = header_multidict(entries)
        d = decide(
            method or "POST", path, headers, raw, policy=policy, secret=secret,
            session_header="", user_field="user",
        )  # fmt: skip
        case: dict[str, Any] = {
            "name": f"{name}/{label}",
            "settings": name,
            "headers": [[k, _bytes(v)] for k, v in entries],
            "body": _bytes(raw),
            "code": d.refusal.code if d.refusal else None,
            "salt": None,
            "account": None,
            "digest": None,
        }
        if d.refusal is None and d.body is not None:
            forwarded = parse_body(d.body, acted_on=())
            sent = forwarded.get("cache_salt")
            one_off = isinstance(sent, str) and sent.startswith(salt.UNCACHEABLE_SALT_PREFIX)
            case["salt"] = salt.UNCACHEABLE_SALT_PREFIX + "*" if one_off else sent  # random
            try:
                account = identity.account_at_gateway(headers, policy, secret)
            except FrontError:  # pragma: no cover - decide refused it above
                account = None
            if account is not None:
                case["account"] = account.text
                if not one_off:
                    case["digest"] = attestation.body_digest(forwarded).hex()
        out.append(case)
    return out


SESSION_HEADERS: list[str | None] = [
    None, "", " ", "\t", "\x1c", "\u3000", "alice", " alice ", "caf\u00e9", "x" * 5000,
]  # fmt: skip
SESSION_BODIES: list[dict[str, Any]] = [
    {},
    {"prompt_cache_key": "k", "user": "u"},
    {"user": "u"},
    {"prompt_cache_key": "k"},
    {"prompt_cache_key": 1, "user": "u"},
    {"prompt_cache_key": None, "user": "u"},
    {"prompt_cache_key": ["k"], "user": "u"},
    {"prompt_cache_key": {"k": 1}, "user": "u"},
    {"prompt_cache_key": True},
    {"prompt_cache_key": "", "user": "u"},
    {"prompt_cache_key": "   ", "user": "u"},
    {"prompt_cache_key": " k "},
    {"prompt_cache_key": "\x1ck\x1f"},
    {"prompt_cache_key": "\u3000k\u2003"},
    {"prompt_cache_key": "\x85k\xa0"},
    {"prompt_cache_key": "a\x85b"},
    {"prompt_cache_key": "a\x00b", "user": "u"},
    {"prompt_cache_key": "a\x7fb", "user": "u"},
    {"prompt_cache_key": "a\nb", "user": "u"},
    {"prompt_cache_key": "a\x1fb", "user": "u"},
    {"prompt_cache_key": "x" * MAX_SESSION_ID_CHARS},
    {"prompt_cache_key": "x" * (MAX_SESSION_ID_CHARS + 1), "user": "u"},
    {"prompt_cache_key": " " + "x" * MAX_SESSION_ID_CHARS + " "},
    {"prompt_cache_key": "\U0001f600" * MAX_SESSION_ID_CHARS},
    {"prompt_cache_key": "\U0001f600" * (MAX_SESSION_ID_CHARS + 1), "user": "u"},
    {"prompt_cache_key": "\u00e9" * MAX_SESSION_ID_CHARS},
    {"prompt_cache_key": "<html>&amp;\u2028"},
    {"user": "\ufffd"},
    {"user": 7},
]
SESSION_SOURCE_ORDERS: dict[str, tuple[SessionSource, ...]] = {
    "all": session_sources(use_user_field=True),
    "no-user": session_sources(use_user_field=False),
    "user-then-header": (SessionSource.USER, SessionSource.HEADER),
    "body-only": (SessionSource.PROMPT_CACHE_KEY,),
}


def _session_cases() -> list[dict[str, Any]]:
    """`request_session` on every header with a body naming both fields, and on every
    body without a header and with a blank one, under each order of sources."""
    pairs: list[tuple[str | None, dict[str, Any]]] = [
        (h, SESSION_BODIES[1]) for h in SESSION_HEADERS
    ] + [(h, b) for h in (None, " ") for b in SESSION_BODIES]
    out = []
    for (order, sources), (header, body) in itertools.product(SESSION_SOURCE_ORDERS.items(), pairs):
        out.append(
            {
                "sources": [s.value for s in sources],
                "order": order,
                "header": header,
                "body": json.dumps(body, ensure_ascii=False),
                "session": request_session(header, body, sources),
            }
        )
    return out


def _sessions() -> dict[str, Any]:
    return {
        "max_id_chars": MAX_SESSION_ID_CHARS,
        "python_whitespace": [c for c in range(0x110000) if chr(c).isspace()],
        "cases": _session_cases(),
    }


def _settings_json() -> dict[str, dict[str, Any]]:
    out = {}
    for name, overrides in SETTINGS.items():
        p = PolicySettings(**overrides)
        out[name] = {
            "isolationMode": p.isolation_mode.value,
            "isolationHeader": p.isolation_header,
            "isolationField": p.isolation_field,
            "honorPromptCacheMaxLen": p.honor_prompt_cache_max_len,
            "allowClientPriority": p.allow_client_priority,
            "allowEngineState": p.allow_engine_state,
            "identityHeader": p.identity_header,
            "identityBearer": p.identity_bearer,
            "identityRequired": p.identity_required,
        }
    return out


def _boundary() -> dict[str, Any]:
    """The picker's body bounds: its flags and the refusals the policy step sends (the
    picker sends the same bytes)."""
    sizes = [(1, 0), (7 * 16384, 100_000), (33_554_433, 32 * 1024**2)]
    seconds = [0.3, 1, 60, 0.001953125, 1234567.0, 3600, 2.5]
    return {
        "flags": {"max_body_bytes": PickerFlag.MAX_BODY_BYTES.value,
                  "body_timeout_seconds": PickerFlag.BODY_TIMEOUT_SECONDS.value},
        "max_body_timeout_seconds": MAX_GATEWAY_POLICY_DRAIN_SECONDS,
        "too_large": [
            {"size": size, "limit": limit, "status": e.status, "code": e.code,
             "body": e.body_bytes().decode()}
            for size, limit in sizes
            for e in [too_large(size, limit)]
        ],
        "body_timeout": [
            {"seconds": s, "status": e.status, "code": e.code, "body": e.body_bytes().decode()}
            for s in seconds
            for e in [body_timeout(s)]
        ],
    }  # fmt: skip


def vectors() -> dict[str, Any]:
    return {
        "_comment": "Generated by tools/picker_vectors.py from promptcache.tenancy; do not edit.",
        "contract": {
            "tenant_salt_parser": TENANT_SALT_PARSER,
            "tenant_salt_parameters": sorted(p.value for p in TenantSaltParam),
            "identity_header": IDENTITY_ATTESTATION_HEADER,
            "session_affinity_plugin": SESSION_AFFINITY_PLUGIN,
            "session_affinity_parameters": sorted(p.value for p in SessionParam),
            "session_sources": [s.value for s in SessionSource],
        },
        "secret": SECRET.hex(),
        "max_isolation_key_chars": MAX_ISOLATION_KEY_CHARS,
        "max_identity_chars": identity.MAX_IDENTITY_CHARS,
        "min_salt_key_bytes": MIN_SALT_KEY_BYTES,
        "salts": _salts(),
        "account_salts": _account_salts(),
        "account_digests": _account_digests(),
        "identities": _identities(),
        "salt_keys": _salt_keys(),
        "body_digests": _body_digests(),
        "attestation": _attestations(),
        "settings": _settings_json(),
        "decisions": _decisions(),
        "sessions": _sessions(),
        "boundary": _boundary(),
    }


_KIND = {
    RouteClass.SALTED: "Salted",
    RouteClass.READ_ONLY: "ReadOnly",
    RouteClass.FRONT: "Front",
    RouteClass.REFUSED: "Refused",
}


def route_table() -> str:
    lines = [
        "// Code generated by tools/picker_vectors.py from tenancy/routes.py; DO NOT EDIT.",
        "",
        "package tenancy",
        "",
        "// routeTable is routes.py's ROUTES: every route of the vLLM release the renderer",
        "// deploys, and what the front does with it.",
        "var routeTable = []Route{",
    ]
    for r in ROUTES:
        methods = ",".join(sorted(r.methods))
        kv, salted = str(r.reaches_kv_cache).lower(), str(r.salt_field).lower()
        lines.append(
            f'\t{{Path: "{r.path}", Methods: "{methods}", Kind: {_KIND[r.kind]}, '
            f"ReachesKV: {kv}, SaltField: {salted}}},"
        )
    lines.append("}")
    return "\n".join(lines) + "\n"


PREDICTIONS: list[Prediction] = [
    Prediction(0, 0, 16),
    Prediction(0, 12, 16),
    Prediction(7, 12, 16),
    Prediction(12, 12, 64),
    Prediction(7, 12, 16, 12, 9),
    Prediction(0, 3, 16, 0, 0),
]


def prediction_vectors() -> dict[str, Any]:
    """The predicted-match header (`tenancy.prediction`), for `picker/prediction`."""
    key = prediction.prediction_key(SECRET)
    return {
        "_comment": "Generated by tools/picker_vectors.py from promptcache.tenancy.prediction; "
        "do not edit.",
        "contract": {
            "plugin": PREDICTED_MATCH_PLUGIN,
            "parameters": sorted(p.value for p in PredictedMatchParam),
            "header": PREDICTED_MATCH_HEADER,
        },
        "secret": SECRET.hex(),
        "key": key.hex(),
        "now": NOW,
        "nonce": NONCE.hex(),
        "max_figure": prediction.MAX_FIGURE,
        "sign": [
            {
                "match_blocks": p.match_blocks,
                "total_blocks": p.total_blocks,
                "block_tokens": p.block_tokens,
                "seen_blocks": p.seen_blocks,
                "held_blocks": p.held_blocks,
                "value": prediction.sign(key, p, now=NOW, nonce=NONCE),
            }
            for p in PREDICTIONS
        ],
    }


def _json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def expected_files() -> dict[Path, str]:
    return {
        VECTORS: _json(vectors()),
        ROUTE_TABLE: route_table(),
        PREDICTION_VECTORS: _json(prediction_vectors()),
    }


def stale_files() -> list[str]:
    return [
        str(p.relative_to(ROOT))
        for p, text in expected_files().items()
        if not p.is_file() or p.read_text(encoding="utf-8") != text
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a file is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        for name in stale:
            print(f"stale: {name} (run python tools/picker_vectors.py)", file=sys.stderr)
        return 1 if stale else 0
    for path, text in expected_files().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
