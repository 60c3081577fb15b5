"""The picker's Go port of the tenancy rules (`picker/tenancy`) is held to the Python
definitions by vectors computed from them (`tools/picker_vectors.py`); `go test` in
`picker/` reads them. These tests fail when the checked-in vectors or the generated Go
route table no longer match what the Python functions give, so a change to the salt, the
key grammar, the account digest, the attestation or the decision cannot land on one side."""

from __future__ import annotations

import json

from tools import picker_vectors


def test_vectors_and_route_table_are_fresh() -> None:
    stale = picker_vectors.stale_files()
    assert not stale, f"stale {stale}: run python tools/picker_vectors.py"


def test_vectors_cover_what_breaks_ports() -> None:
    """The cases the issue names are there, each with the outcome Python gives."""
    data = json.loads(picker_vectors.VECTORS.read_text(encoding="utf-8"))
    by_name = {d["name"]: d for d in data["decisions"]}
    assert by_name["perkey/invalid-utf8-body"]["code"] == "invalid_json"
    assert by_name["perkey/key-header-nul"]["salt"].startswith("pck1-")
    assert by_name["perkey/key-field-9"]["salt"].startswith("pck1-")  # 4096 chars: allowed
    assert by_name["perkey/key-too-long"]["code"] == "invalid_isolation_key"
    assert by_name["perkey/key-astral-at-limit"]["salt"].startswith("pck1-")  # code points
    assert by_name["perkey/key-too-long-astral"]["code"] == "invalid_isolation_key"
    assert by_name["perkey/dup-top"]["code"] == "duplicate_field"
    assert by_name["perkey/fold-long-s"]["code"] == "ambiguous_field"
    assert by_name["perkey/client-salt"]["salt"] is None  # a client's salt never passes
    assert by_name["account-header/html-numbers"]["digest"] is None  # no account sent
    assert by_name["account-header/id-header-key"]["digest"]
    assert any(k["raw"] != k["secret"] for k in data["salt_keys"] if k["secret"])
    bodies = [b["body"] for b in data["body_digests"]]
    assert any("<script>" in b for b in bodies if isinstance(b, str))
    assert any("1e16" in b for b in bodies if isinstance(b, str))


def test_session_vectors_cover_what_breaks_ports() -> None:
    """The session a request names (`contract.session.request_session`): the cases a Go
    port gets wrong first are there, each with the outcome Python gives."""
    data = json.loads(picker_vectors.VECTORS.read_text(encoding="utf-8"))
    sessions = data["sessions"]
    assert 0x1C in sessions["python_whitespace"]  # Python strips it; Go's IsSpace does not
    cases = {(c["order"], c["header"], c["body"]): c["session"] for c in sessions["cases"]}
    both = json.dumps({"prompt_cache_key": "k", "user": "u"})
    assert cases[("all", "alice", both)] == "alice"  # an explicit header wins
    assert cases[("all", " ", both)] == "k"  # a blank header names nothing
    assert cases[("all", "\x1c", both)] == "k"  # blank as Python counts it
    assert cases[("user-then-header", "alice", both)] == "u"  # the sources' order decides
    assert cases[("no-user", None, json.dumps({"user": "u"}))] is None
    stripped = json.dumps({"prompt_cache_key": "\x1ck\x1f"}, ensure_ascii=False)
    assert cases[("all", None, stripped)] == "k"
    astral = json.dumps({"prompt_cache_key": "\U0001f600" * 256}, ensure_ascii=False)
    assert cases[("all", None, astral)] == "\U0001f600" * 256  # code points, not bytes
    data_contract = data["contract"]
    assert data_contract["session_affinity_parameters"] == sorted(
        ["header", "sources", "ttlSeconds", "maxSessions"]
    )
