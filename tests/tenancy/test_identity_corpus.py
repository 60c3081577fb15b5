"""The identity path's hostile corpus (`harness/identity_corpus.py`) on the one function
that reads an account (the policy step's); the same corpus runs over real sockets through
both processes in tests/identity/."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from harness.identity_corpus import ACCOUNTS, CORPUS, SECRET, USER, Case
from promptcache.contract import IsolationMode
from promptcache.tenancy import errors
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.identity import account_at_gateway, account_digest
from promptcache.tenancy.settings import PolicySettings

BOTH = PolicySettings(
    isolation_mode=IsolationMode.PER_KEY, identity_header=USER, identity_bearer=True
)


@pytest.mark.parametrize("case", CORPUS, ids=[c.name for c in CORPUS])
def test_the_identity_corpus(case: Case) -> None:
    headers = CIMultiDict(case.headers)
    if case.outcome == "refused":
        with pytest.raises(FrontError) as refused:
            account_at_gateway(headers, BOTH, SECRET)
        assert refused.value.status == 400
        assert refused.value.code == errors.INVALID_IDENTITY
        assert refused.value.param in (USER, "Authorization")
        return
    got = account_at_gateway(headers, BOTH, SECRET)
    if case.outcome == "none":
        assert got is None
    else:
        assert got == ACCOUNTS[case.outcome.removeprefix("account:")]


def test_the_corpus_accounts_are_all_different() -> None:
    digests = [a.digest for a in ACCOUNTS.values()]
    assert len(set(digests)) == len(digests)


def test_without_sources_no_account_is_read() -> None:
    keyed = PolicySettings(isolation_mode=IsolationMode.PER_KEY)
    headers = CIMultiDict({USER: "alice", "authorization": "Bearer tokA"})
    assert account_at_gateway(headers, keyed, SECRET) is None


def test_only_the_configured_source_is_read() -> None:
    header_only = PolicySettings(isolation_mode=IsolationMode.PER_KEY, identity_header=USER)
    bearer_only = PolicySettings(isolation_mode=IsolationMode.PER_KEY, identity_bearer=True)
    token = CIMultiDict({"authorization": "Bearer tokA"})
    user = CIMultiDict({USER: "alice"})
    assert account_at_gateway(token, header_only, SECRET) is None
    assert account_at_gateway(user, bearer_only, SECRET) is None
    assert account_at_gateway(token, bearer_only, SECRET) == ACCOUNTS["tokA"]


def test_an_account_is_keyed_by_the_secret() -> None:
    assert account_digest(b"t" * 32, "header", "alice") != ACCOUNTS["alice"].digest
