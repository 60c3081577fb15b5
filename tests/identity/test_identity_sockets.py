"""Isolation by account through both processes, over real sockets (see conftest.py).

- the identity corpus (`harness/identity_corpus.py`): every header set gets the same
  outcome through the gateway as the reading function gives it, and the pod's vLLM gets
  exactly that account's salt; a malformed one sent to the pod directly gets the step's
  refusal from the front;
- a pod reached directly with a forged identity header, a forged or replayed attestation,
  or a valid attestation on another body gets no account's scope;
- a client's own attestation header never passes the gateway;
- Required per account refuses a request without an account with one error, at the
  gateway and at the front.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from harness.identity_corpus import ACCOUNTS, CORPUS, SECRET, USER, Case
from harness.identity_plane import Answer, MakePlane, Plane
from promptcache.contract import DEFAULT_ISOLATION_HEADER, IDENTITY_ATTESTATION_HEADER
from promptcache.tenancy.identity import Account, account_digest
from promptcache.tenancy.salt import derive_account_salt, derive_salt

KEY = DEFAULT_ISOLATION_HEADER
ALICE = ACCOUNTS["alice"]


def chat(text: str = "hello") -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 4}


def salt_of(account: Account, key: str | None = None) -> str:
    return derive_account_salt(SECRET, account.digest, key)


def attestation(answer: Answer) -> str:
    values = [v for k, v in answer.pod_headers if k == IDENTITY_ATTESTATION_HEADER]
    assert len(values) == 1, answer.pod_headers
    return values[0]


@pytest.mark.parametrize("case", CORPUS, ids=[c.name for c in CORPUS])
async def test_the_identity_corpus_through_the_gateway_and_at_the_pod(
    make_plane: MakePlane, case: Case
) -> None:
    plane = await make_plane()
    headers = list(case.headers)
    through = await plane.through(headers, chat())
    direct = None
    names = {k for k, _ in headers}
    # an HTTP client cannot send control characters; aiohttp's keeps one spelling of a name
    if not any(c < " " for _, v in headers for c in v) and len(names) == len(
        {k.lower() for k in names}
    ):
        direct = await plane.direct(headers, json.dumps(chat()).encode())
    if case.outcome == "refused":
        assert (through.at, through.status) == ("gateway", 400)
        assert through.body["error"]["code"] == "invalid_identity"
        if direct is not None:
            # the front refuses a malformed source with the step's very answer (behind
            # promptcache's picker, which has no step, that is where it is refused)
            assert (direct.at, direct.status, direct.body) == ("front", 400, through.body)
        return
    if direct is not None:
        # the pod never takes an account from the identity headers: the same headers sent
        # straight to it reach the keyless scope, whatever they say
        assert direct.status == 200
        assert direct.salt is None
    assert (through.at, through.status) == ("front", 200)
    if case.outcome == "none":
        assert through.salt is None
        assert not [k for k, _ in through.pod_headers if k == IDENTITY_ATTESTATION_HEADER]
    else:
        assert through.salt == salt_of(ACCOUNTS[case.outcome.removeprefix("account:")])


async def test_two_accounts_with_one_key_get_two_scopes_and_neither_is_the_keys(
    make_plane: MakePlane,
) -> None:
    plane = await make_plane()
    a = await plane.through([(USER, "alice"), (KEY, "team")], chat())
    b = await plane.through([(USER, "bob"), (KEY, "team")], chat())
    keyless_a = await plane.through([(USER, "alice")], chat())
    anonymous = await plane.through([(KEY, "team")], chat())
    assert a.salt == salt_of(ALICE, "team")
    assert b.salt is not None
    assert len({a.salt, b.salt, keyless_a.salt, anonymous.salt}) == 4
    assert anonymous.salt == derive_salt(SECRET, "team")  # no account: the key's own scope


async def test_a_forged_identity_header_at_the_pod_reaches_no_ones_scope(
    make_plane: MakePlane,
) -> None:
    plane = await make_plane()
    body = json.dumps(chat()).encode()
    for headers in ([(USER, "alice")], [(USER, "alice"), (KEY, "team")],
                    [("authorization", "Bearer tokA")]):  # fmt: skip
        forged = await plane.direct(headers, body)
        assert forged.status == 200
        assert forged.salt not in {salt_of(ALICE), salt_of(ALICE, "team"),
                                   salt_of(ACCOUNTS["tokA"])}  # fmt: skip


async def test_a_replayed_or_transplanted_attestation_reaches_no_ones_scope(
    make_plane: MakePlane,
) -> None:
    plane = await make_plane()
    genuine = await plane.through([(USER, "alice"), (KEY, "team")], chat("the real one"))
    assert genuine.salt == salt_of(ALICE, "team")
    # the very request again, straight to the pod: accepted once only
    replayed = await plane.direct(genuine.pod_headers, genuine.forwarded)
    assert replayed.status == 200
    assert replayed.salt == derive_salt(SECRET, "team")  # the key alone: not alice's
    # the attestation on another prompt, or with another key, is no one's either
    stamp = [(IDENTITY_ATTESTATION_HEADER, attestation(genuine)), (KEY, "team")]
    other = await plane.direct(stamp, json.dumps(chat("probe")).encode())
    assert other.salt == derive_salt(SECRET, "team")
    rekeyed = [(IDENTITY_ATTESTATION_HEADER, attestation(genuine)), (KEY, "other")]
    assert (await plane.direct(rekeyed, genuine.forwarded)).salt == derive_salt(SECRET, "other")
    # a forged one in the right form
    fake = attestation(genuine)[:-4] + "AAAA"
    forged = await plane.direct([(IDENTITY_ATTESTATION_HEADER, fake)], genuine.forwarded)
    assert forged.salt is None
    metrics = await (await plane.http.get(plane.front_url + "/metrics")).text()
    for outcome in ("valid", "replayed", "forged"):
        assert f'promptcache_front_identity_attestations_total{{outcome="{outcome}"}}' in metrics


async def test_a_clients_attestation_never_passes_the_gateway(make_plane: MakePlane) -> None:
    plane = await make_plane()
    genuine = await plane.through([(USER, "alice")], chat())
    stolen = attestation(genuine)
    # without an account of its own, the client's copy is removed...
    smuggled = await plane.through([(IDENTITY_ATTESTATION_HEADER, stolen)], chat())
    assert not [v for k, v in smuggled.pod_headers if k == IDENTITY_ATTESTATION_HEADER]
    assert smuggled.salt is None
    # ...and with one, the step's replaces it
    as_bob = await plane.through([(IDENTITY_ATTESTATION_HEADER, stolen), (USER, "bob")], chat())
    assert attestation(as_bob) != stolen
    assert as_bob.salt == salt_of(Account(account_digest(SECRET, "header", "bob")))
    # the picker never saw the client's copy either
    seen = plane.picker.fake.streams[-1].headers()
    assert IDENTITY_ATTESTATION_HEADER not in {k for k, _ in seen}


async def test_required_per_account_refuses_alike_at_the_gateway_and_the_front(
    make_plane: MakePlane,
) -> None:
    plane: Plane = await make_plane(identity_required=True)
    body = chat()
    refused = await plane.through([(KEY, "team")], body)
    at_pod = await plane.direct([(USER, "alice"), (KEY, "team")], json.dumps(body).encode())
    assert (refused.at, refused.status) == ("gateway", 401)
    assert (at_pod.at, at_pod.status) == ("front", 401)
    assert refused.body == at_pod.body
    assert refused.body["error"]["code"] == "identity_required"
    assert refused.body["error"]["type"] == "authentication_error"
    allowed = await plane.through([(USER, "alice"), (KEY, "team")], body)
    assert (allowed.status, allowed.salt) == (200, salt_of(ALICE, "team"))
    replayed = await plane.direct(allowed.pod_headers, allowed.forwarded)
    assert replayed.status == 401  # a replay has no account, so it is refused too


async def test_the_steps_salt_is_not_counted_as_a_clients(make_plane: MakePlane) -> None:
    """Behind the gateway every keyed request reaches the front with the salt the step set;
    `client_cache_salt_removed_total` counts only salts that are not the policy's own."""
    plane = await make_plane()

    async def removed() -> float:
        async with plane.http.get(plane.front_url + "/metrics") as resp:
            text = await resp.text()
        line = next(
            ln for ln in text.splitlines()
            if ln.startswith("promptcache_front_client_cache_salt_removed_total ")
        )  # fmt: skip
        return float(line.split()[-1])

    for headers in ([(KEY, "team")], [(USER, "alice"), (KEY, "team")], [(USER, "alice")]):
        answer = await plane.through(headers, {**chat(), "cache_salt": "forged"})
        assert answer.status == 200
    assert await removed() == 0  # the client's forged salts were dropped at the gateway
    await plane.direct([(KEY, "team")], json.dumps({**chat(), "cache_salt": "forged"}).encode())
    assert await removed() == 1


async def test_a_large_body_decided_in_a_worker_process_is_signed_too(
    make_plane: MakePlane,
) -> None:
    """Bodies from 256 KiB up are decided in the step's worker processes: the signer
    travels there and back, and the front verifies what the worker signed."""
    plane = await make_plane()
    answer = await plane.through([(USER, "alice")], chat("x" * (400 * 1024)))
    assert answer.status == 200
    assert answer.salt == salt_of(ALICE)
    # the front decides it in a JSON worker process too (`offload.prepare`): the worker
    # checks the attestation, the serving process admits it once, so a replay of the very
    # request straight to the pod is decided again without the account
    replayed = await plane.direct(answer.pod_headers, answer.forwarded)
    assert replayed.status == 200
    assert replayed.salt is None
    metrics = await (await plane.http.get(plane.front_url + "/metrics")).text()
    assert 'promptcache_front_identity_attestations_total{outcome="replayed"} 1.0' in metrics
