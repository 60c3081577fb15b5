"""What the picker reads from what the policy step forwards: the salt the step set, always.

The Endpoint Picker decodes the body with Go's `encoding/json` (keys matched regardless of
case with Unicode folding, a later member or a `null` winning, invalid UTF-8 read as
U+FFFD, a BOM or UTF-16 not parsed at all). `picker_decode/main.go` (standard library
only, built here with the installed Go toolchain and cached by its source's hash) decodes
bodies with those rules into the picker's request struct shape. For a generated corpus of
key spellings, duplicates, nulls, encodings, stray bytes and trailers, whatever the step
forwards must decode, and its `cache_salt` must be exactly the salt the step derived:
the tenant's HMAC when a key was sent, none otherwise; in Required mode nothing keyless is
forwarded at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from harness.extproc_gateway import JSON, GatewayPolicyFactory, Upstream, body_msg, headers_msg
from promptcache.contract import IsolationMode
from promptcache.gateway.decision import decide
from promptcache.tenancy.attestation import Attester, Outcome, ReplayGuard
from promptcache.tenancy.canonical import GO_FOLDS_TO_ASCII, parse_body
from promptcache.tenancy.salt import derive_salt
from promptcache.tenancy.settings import PolicySettings

SECRET = b"p" * 32
KEY_HEADER = "x-prompt-cache-isolation-key"
KEY_FIELD = "prompt_cache_isolation_key"
SOURCE = Path(__file__).parent / "picker_decode" / "main.go"
MODES = [IsolationMode.SHARED, IsolationMode.PER_KEY, IsolationMode.REQUIRED]
# The first test pays for `go build` of the decoder (a 600 s bound of its own) when cold.
pytestmark = pytest.mark.timeout(900)

SALT_SPELLINGS = [
    "cache_salt",
    "CACHE_SALT",
    "Cache_Salt",
    "cache_\u017falt",  # LATIN SMALL LETTER LONG S folds to s
    "CACHE_\u017fALT",
    "cache_SALT",
]
KEY_SPELLINGS = [KEY_FIELD, KEY_FIELD.upper(), "prompt_cache_isolation_\u212aey"]  # KELVIN SIGN


def _go() -> str | None:
    return shutil.which("go")


@pytest.fixture(scope="module")
def picker_decode() -> Iterator[PickerDecoder]:
    go = _go()
    if go is None:
        pytest.skip("needs the Go toolchain (go build of a standard-library program)")
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "promptcache"
    binary = cache / "go-tools" / f"picker_decode-{digest}"
    if not binary.exists():
        binary.parent.mkdir(parents=True, exist_ok=True)
        partial = binary.with_suffix(".partial")
        env = {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOFLAGS": ""}
        subprocess.run(
            [go, "build", "-o", str(partial), str(SOURCE)],
            check=True,
            env=env,
            cwd=SOURCE.parent,
            timeout=600,
        )
        partial.rename(binary)
    decoder = PickerDecoder(str(binary))
    try:
        yield decoder
    finally:
        decoder.close()


class PickerDecoder:
    """One long-lived Go process answering one body at a time."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.proc = subprocess.Popen(
            [binary], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
        )

    def read(self, route: str, body: bytes) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(f"{route} {len(body)}\n".encode() + body)
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def folds(self) -> dict[str, str]:
        out = subprocess.run([self.binary, "fold"], check=True, capture_output=True, text=True)
        pairs = (line.split(" ", 1) for line in out.stdout.splitlines())
        return {chr(int(code[2:], 16)): folded for code, folded in pairs}

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=10)


def test_the_fold_table_is_gos(picker_decode: PickerDecoder) -> None:
    """Every non-ASCII rune Go folds to ASCII is in the step's table (and no other)."""
    assert picker_decode.folds() == GO_FOLDS_TO_ASCII


def test_the_decoder_reads_as_the_picker_does(picker_decode: PickerDecoder) -> None:
    """The attacks themselves, on the Go side: what a step forwarding as sent would route."""
    read = picker_decode.read
    assert read("chat", b'{"cache_salt":"a","CACHE_SALT":"b"}')["salt"] == "b"
    assert read("chat", '{"cache_\u017falt":"forged"}'.encode())["salt"] == "forged"
    assert read("chat", b'{"cache_salt":"good","cache_salt":null}')["salt"] == "good"
    assert read("chat", b'{"cache_salt":"\xff"}')["salt"] == "\ufffd"
    assert not read("chat", b'\xef\xbb\xbf{"cache_salt":"a"}')["ok"]
    assert not read("chat", '{"cache_salt":"a"}'.encode("utf-16"))["ok"]


# ------------------------------------------------------------------ the generated corpus

member_values = st.one_of(
    st.none(),
    st.text(max_size=12),
    st.integers(-5, 5),
    st.booleans(),
    st.just({"nested": "x"}),
)


@st.composite
def hostile_bodies(draw: st.DrawFn) -> tuple[bytes, str | None, str]:
    """(raw body, header key or None, route) — members spelled, repeated and encoded as an
    attacker would, serialised by hand so duplicates and stray bytes survive."""
    route = draw(st.sampled_from(["chat", "completion"]))
    members: list[tuple[str, Any]] = []
    if route == "chat":
        members.append(("messages", [{"role": "user", "content": "hello"}]))
    else:
        members.append(("prompt", "hello"))
    members.append(("model", "m"))
    exact = ["cache_salt", KEY_FIELD] * 3  # weighted: most bodies are forwarded
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(exact + SALT_SPELLINGS + KEY_SPELLINGS))
        members.append((name, draw(member_values)))
    members = draw(st.permutations(members))
    parts = [
        json.dumps(k, ensure_ascii=draw(st.booleans())) + ":" + json.dumps(v) for k, v in members
    ]
    raw = ("{" + ",".join(parts) + "}").encode()
    encoding = draw(st.sampled_from(["utf-8"] * 6 + ["bom", "utf-16", "stray"]))
    if encoding == "bom":
        raw = b"\xef\xbb\xbf" + raw
    elif encoding == "utf-16":
        raw = raw.decode().encode("utf-16")
    elif encoding == "stray":
        at = draw(st.integers(1, len(raw) - 1))
        raw = raw[:at] + draw(st.sampled_from([b"\xff", b"\xc5", b"\xed\xa0\x80"])) + raw[at:]
    header_key = draw(st.one_of(st.none(), st.sampled_from(["tenant-a", "tenant-b"])))
    return raw, header_key, route


def expected_salt(header_key: str | None, mode: IsolationMode) -> str | None:
    """The only salt the picker may read: the header tenant's, or none. (A key sent in a
    field is looked at separately: the forwarded body must then carry that key's salt.)"""
    if mode is IsolationMode.SHARED or header_key is None:
        return None
    return derive_salt(SECRET, header_key)


PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=hostile_bodies(), mode=st.sampled_from(MODES))
def test_the_picker_reads_the_salt_the_step_set(
    picker_decode: PickerDecoder, case: tuple[bytes, str | None, str], mode: IsolationMode
) -> None:
    raw, header_key, route = case
    headers = dict(JSON) if header_key is None else {**JSON, KEY_HEADER: header_key}
    decision = decide(
        "POST", PATHS[route], headers, raw, policy=PolicySettings(isolation_mode=mode),
        secret=SECRET, session_header="", user_field="user",
    )  # fmt: skip
    if decision.refusal is not None:
        assert decision.refusal.status in {400, 403}
        return
    assert decision.body is not None  # a salted route's body is always the canonical one
    seen = picker_decode.read(route, decision.body)
    assert seen["ok"], seen
    forwarded = json.loads(decision.body)
    # what Go reads is what Python reads is what the step set
    assert seen["salt"] == forwarded.get("cache_salt", "")
    field_key = forwarded.get(KEY_FIELD)
    key = header_key or (field_key if isinstance(field_key, str) and field_key else None)
    if mode is IsolationMode.SHARED or key is None:
        assert mode is not IsolationMode.REQUIRED  # keyless is never routed in Required
        assert seen["salt"] == ""
    else:
        assert seen["salt"] == derive_salt(SECRET, key)


# ------------------------------------------------------ over real sockets, with trailers


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "raw",
    [
        b'{"model":"m","messages":[{"role":"user","content":"hi"}],"CACHE_SALT":"forged"}',
        '{"model":"m","messages":[],"cache_\u017falt":"forged"}'.encode(),
        b'{"model":"m","messages":[],"cache_salt":"forged","cache_salt":null}',
        b'{"model":"m","messages":[{"role":"user","content":"\xff"}]}',
        b'\xef\xbb\xbf{"model":"m","messages":[]}',
        b'{"model":"m","messages":[{"role":"user","content":"hi"}],"cache_salt":"forged"}',
    ],
    ids=["upper", "long-s", "dup-null", "stray-byte", "bom", "plain-forged"],
)
@pytest.mark.parametrize("trailers", [False, True], ids=["eos", "trailers"])
async def test_over_sockets_the_picker_never_reads_a_salt_the_step_did_not_set(
    make_gateway_policy: GatewayPolicyFactory,
    upstream: Upstream,
    gateway_for: Any,
    picker_decode: PickerDecoder,
    raw: bytes,
    mode: IsolationMode,
    trailers: bool,
) -> None:
    shim = await make_gateway_policy(isolation_mode=mode, secret=SECRET)
    gw = gateway_for(shim)
    messages = [headers_msg({}), body_msg(raw, end_of_stream=not trailers)]
    if trailers:
        messages.append(pb.ProcessingRequest(request_trailers=pb.HttpTrailers()))
    responses = await gw.exchange(*messages)
    if not upstream.fake.streams:
        (only,) = responses  # refused by the step, with the front's error
        assert only.WhichOneof("response") == "immediate_response"
        assert only.immediate_response.status.code in {400, 403}
        return
    (stream,) = upstream.fake.streams
    kinds = [m.WhichOneof("request") for m in stream.received]
    assert kinds[:2] == ["request_headers", "request_body"]  # decided before forwarded
    if trailers:
        assert kinds[-1] == "request_trailers"
    body = b"".join(
        m.request_body.body for m in stream.received if m.WhichOneof("request") == "request_body"
    )
    seen = picker_decode.read("chat", body)
    assert seen["ok"], seen
    assert mode is not IsolationMode.REQUIRED  # keyless
    assert seen["salt"] == ""  # no key was sent: the shared scope, never the forged salt


# --------------------------- the signed account survives the picker's re-encoding (#27)

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats(allow_nan=False, allow_infinity=False, width=64)
    | st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=10)
    | st.sampled_from(["<b>&amp;</b>", "\u2028\u2029", "é", "\U0001f600", 'a"b\\c'])
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(alphabet="abcxyz_", min_size=1, max_size=5), inner, max_size=4)
    ),
    max_leaves=16,
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(extra=st.dictionaries(st.sampled_from(["temperature", "max_tokens", "n", "logit_bias",
                                              "tools", "metadata", "seed", "top_p"]),
                             _values, max_size=4),
       account=st.sampled_from(["alice", "bob"]))  # fmt: skip
def test_the_signed_account_verifies_on_the_body_gie_forwards(
    picker_decode: PickerDecoder, extra: dict[str, Any], account: str
) -> None:
    """GIE v1.5 re-encodes the body (json.Marshal of the decoded map: sorted keys, float64
    numbers, escaped HTML) before the pod sees it; the front must still verify the step's
    signature on what arrives, and on nothing else."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi <&>"}], **extra}
    policy = PolicySettings(isolation_mode=IsolationMode.PER_KEY, identity_header="x-user")
    step = Attester(SECRET, KEY_HEADER)
    headers = {**JSON, "x-user": account, KEY_HEADER: "team"}
    decision = decide(
        "POST", PATHS["chat"], headers, json.dumps(body).encode(), policy=policy,
        secret=SECRET, session_header="", user_field="user", attester=step,
    )  # fmt: skip
    assert decision.refusal is None, decision.refusal
    assert decision.body is not None
    assert decision.attestation is not None
    seen = picker_decode.read("chat", decision.body)
    assert seen["ok"], seen
    arrived = parse_body(seen["forwarded"].encode(), acted_on=())
    front = Attester(SECRET, KEY_HEADER, guard=ReplayGuard())
    pod = CIMultiDict({KEY_HEADER: "team", "x-promptcache-identity": decision.attestation})
    assert front.verify(pod, arrived).outcome is Outcome.VALID
    probe = {**arrived, "messages": [{"role": "user", "content": "another prompt"}]}
    assert front.verify(pod, probe).outcome is Outcome.FORGED
