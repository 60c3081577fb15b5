"""The identity path's hostile corpus: header sets a client (or a misconfigured gateway)
could send, and what the gateway's policy step must make of each.

Shared by the unit test of the reading function (`tests/tenancy/test_identity_corpus.py`)
and the socket test that runs it through both processes (`tests/identity/`). Outcomes:
`account:<label>` (the account `ACCOUNTS[label]`; equal labels name the same account),
`none`, or `refused` (HTTP 400 `invalid_identity`).
"""

from __future__ import annotations

from dataclasses import dataclass

from promptcache.tenancy.identity import MAX_IDENTITY_CHARS, Account, account_digest

SECRET = b"s" * 32
USER = "x-auth-user"


@dataclass(frozen=True)
class Case:
    name: str
    headers: tuple[tuple[str, str], ...]
    outcome: str
    """`account:<label>` (equal labels: the same account), `none`, or `refused`."""


def _account(source: str, value: str) -> Account:
    """The account the step must read (under `SECRET`)."""
    return Account(account_digest(SECRET, source, value))


ACCOUNTS = {
    "alice": _account("header", "alice"),
    "Alice": _account("header", "Alice"),
    "alice%40x": _account("header", "alice%40x"),
    "alice@x": _account("header", "alice@x"),
    "caf\u00e9": _account("header", "caf\u00e9"),
    "cafe\u0301": _account("header", "cafe\u0301"),
    "tokA": _account("bearer", "tokA"),
    "toka": _account("bearer", "toka"),
    "tok/+=": _account("bearer", "tok/+="),
    "h:tokA": _account("header", "tokA"),
}

CORPUS: tuple[Case, ...] = (
    # --- the identity header -------------------------------------------------------------
    Case("plain", ((USER, "alice"),), "account:alice"),
    Case("name case does not matter", (("X-Auth-User", "alice"),), "account:alice"),
    Case("surrounding spaces are not part of it", ((USER, "  alice\t"),), "account:alice"),
    Case("value case does", ((USER, "Alice"),), "account:Alice"),
    Case("percent escapes are kept", ((USER, "alice%40x"),), "account:alice%40x"),
    Case("unescaped is another account", ((USER, "alice@x"),), "account:alice@x"),
    Case("NFC", ((USER, "caf\u00e9"),), "account:caf\u00e9"),
    Case("NFD is another account", ((USER, "cafe\u0301"),), "account:cafe\u0301"),
    Case("two equal copies count once", ((USER, "alice"), (USER, "alice ")), "account:alice"),
    Case("two different copies", ((USER, "alice"), (USER, "bob")), "refused"),
    Case("a copy and an empty one", ((USER, "alice"), (USER, "")), "refused"),
    Case("case variants of one name", ((USER, "alice"), ("X-AUTH-USER", "Alice")), "refused"),
    Case("empty is none", ((USER, ""),), "none"),
    Case("blank is none", ((USER, "   "),), "none"),
    Case("control character", ((USER, "al\x01ice"),), "refused"),
    Case("too long", ((USER, "a" * (MAX_IDENTITY_CHARS + 1)),), "refused"),
    Case(
        "the header wins over a token",
        ((USER, "alice"), ("authorization", "Bearer tokA")),
        "account:alice",
    ),
    Case(
        "a token value in the header is not the token's account",
        ((USER, "tokA"),),
        "account:h:tokA",
    ),
    # --- the bearer token -----------------------------------------------------------------
    Case("bearer", (("authorization", "Bearer tokA"),), "account:tokA"),
    Case("scheme in any case", (("Authorization", "bEaReR tokA"),), "account:tokA"),
    Case("spaces around the token", (("authorization", "  Bearer   tokA  "),), "account:tokA"),
    Case("a tab after the scheme", (("authorization", "Bearer\ttokA"),), "account:tokA"),
    Case("token case matters", (("authorization", "Bearer toka"),), "account:toka"),
    Case("token68 characters", (("authorization", "Bearer tok/+="),), "account:tok/+="),
    Case("inner whitespace", (("authorization", "Bearer tok A"),), "refused"),
    Case("quotes", (("authorization", 'Bearer "tokA"'),), "refused"),
    Case("empty token", (("authorization", "Bearer "),), "refused"),
    Case("scheme alone", (("authorization", "Bearer"),), "refused"),
    Case(
        "two different tokens",
        (("authorization", "Bearer tokA"), ("authorization", "Bearer toka")),
        "refused",
    ),
    Case("another scheme", (("authorization", "Basic dXNlcjpwdw=="),), "none"),
    Case("no headers", (), "none"),
)
