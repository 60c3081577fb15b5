"""The reverse of the boundary property: what the API server refuses, `promptcache render` refuses.

The corpus is the API server's own (`e2e/testdata/invalid-pcd/`, each case with the exact
causes `kubectl apply` prints, checked on a real API server by e2e/test_crd_validation.py).
Here each case goes through the CLI: it must be refused, every field the API server names
must be named, and a cross-field (CEL) rule's message must be the very same text.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from promptcache.api.rules import RULES
from promptcache.cli import main

CORPUS = sorted(
    (Path(__file__).resolve().parents[2] / "e2e" / "testdata" / "invalid-pcd").glob("*.yaml")
)
RULE_MESSAGES = {rule.message for rule in RULES}


def _api_causes(case: Path) -> list[str]:
    return [
        line.split("# expect:", 1)[1].strip()
        for line in case.read_text().splitlines()
        if line.startswith("# expect:")
    ]


def _field_of(cause: str) -> str | None:
    """The field path the API server names, or None for its secondary lines."""
    unknown = re.match(r'strict decoding error: unknown field "([^"]+)"', cause)
    if unknown:
        return unknown.group(1)
    path = cause.split(":", 1)[0]
    if path == "<nil>" or path.startswith("."):
        return None  # "rules not checked" and the scale subresource's echo (see the README)
    return path


@pytest.mark.parametrize("case", CORPUS, ids=[c.stem for c in CORPUS])
def test_what_the_api_server_refuses_the_cli_refuses_alike(
    case: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["render", "-f", str(case)]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    cli_lines = [line.removeprefix("error: ") for line in out.err.splitlines()]
    for cause in _api_causes(case):
        field = _field_of(cause)
        if field is None:
            continue
        named = [line for line in cli_lines if line.startswith(f"{field}:")]
        assert named, f"the CLI does not name {field}: {cli_lines}"
        message = cause.removeprefix(f"{field}: Invalid value: ")
        if message in RULE_MESSAGES:
            assert f"{field}: {message}" in cli_lines


def test_the_corpus_covers_every_rule() -> None:
    causes = "\n".join(c for case in CORPUS for c in _api_causes(case))
    assert [m for m in RULE_MESSAGES if m not in causes] == []
