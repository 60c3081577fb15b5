"""Every class of bad input exits 2 with one line per problem naming the field: no traceback.

Each file in `bad_inputs/` carries the exact lines a user must see in `# expect:` comments.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import run_cli

BAD_INPUTS = Path(__file__).parent / "bad_inputs"
CASES = sorted(BAD_INPUTS.glob("*.yaml"))


def expected_lines(path: Path) -> list[str]:
    return [
        "error: " + line.removeprefix("# expect: ")
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.startswith("# expect: ")
    ]


def test_the_corpus_covers_every_class() -> None:
    names = {case.stem for case in CASES}
    for required in (
        "yaml-syntax",
        "unknown-field",
        "wrong-type-int",
        "out-of-range-lru",
        "bad-enum",
        "wrong-kind",
        "wrong-api-version",
        "cel-required-isolation",
        "cel-unique-tiers",
        "name-too-long",
    ):
        assert required in names
    assert len(CASES) >= 20


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_bad_input_is_refused_with_the_message_a_user_sees(case: Path) -> None:
    result = run_cli("render", "-f", case.name, cwd=BAD_INPUTS)
    assert result.returncode == 2, result.stdout
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == expected_lines(case)


def test_stdin_is_read_with_dash(tmp_path: Path) -> None:
    text = (BAD_INPUTS / "wrong-type-int.yaml").read_text(encoding="utf-8")
    result = run_cli("render", "-f", "-", cwd=tmp_path, stdin=text)
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["error: spec.model.replicas: must be an integer"]


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    result = run_cli("render", "-f", "nope.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["error: cannot read nope.yaml: No such file or directory"]
