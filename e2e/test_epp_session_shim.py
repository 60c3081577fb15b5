"""Which `user` values the session shim turns into a session header (no cluster needed).

A client controls `user`, so the shim must never forward something a header
cannot carry, and must leave requests it cannot read exactly as they were.
"""

from __future__ import annotations

import json

import pytest

from epp.session_shim import MAX_SESSION_ID_CHARS, session_from_body

GOOD = [
    ({"user": "alice"}, "alice"),
    ({"user": "  bob  "}, "bob"),
    ({"user": "tenant-7/user-42@example.com"}, "tenant-7/user-42@example.com"),
    ({"user": "ü-ñ"}, "ü-ñ"),
    ({"user": "x" * MAX_SESSION_ID_CHARS}, "x" * MAX_SESSION_ID_CHARS),
]
BAD = [
    b"",
    b"not json",
    b"\xff\xfe",
    b"[1, 2]",
    b'"alice"',
    json.dumps({}).encode(),
    json.dumps({"user": None}).encode(),
    json.dumps({"user": 42}).encode(),
    json.dumps({"user": ["alice"]}).encode(),
    json.dumps({"user": {"id": "alice"}}).encode(),
    json.dumps({"user": ""}).encode(),
    json.dumps({"user": "   "}).encode(),
    json.dumps({"user": "x" * (MAX_SESSION_ID_CHARS + 1)}).encode(),
    json.dumps({"user": "evil\r\nx-injected: 1"}).encode(),
    json.dumps({"user": "tab\there"}).encode(),
    json.dumps({"user": "del\x7f"}).encode(),
    json.dumps({"User": "alice"}).encode(),
]


@pytest.mark.parametrize(("body", "session"), GOOD)
def test_usable_user_becomes_the_session(body: dict[str, str], session: str) -> None:
    assert session_from_body(json.dumps(body).encode()) == session


@pytest.mark.parametrize("raw", BAD)
def test_unusable_user_is_ignored(raw: bytes) -> None:
    assert session_from_body(raw) is None


def test_another_field_can_be_configured() -> None:
    assert session_from_body(b'{"session": "s1", "user": "u"}', field="session") == "s1"
