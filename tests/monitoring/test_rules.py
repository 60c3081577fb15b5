"""The alerting and recording rules, checked by the pinned promtool.

`promtool check rules` parses every expression; `promtool test rules` runs
rules-test.yaml, which has a firing and a quiet case for every alert. A mutated
threshold must make the unit tests fail (they are not vacuous), and every alert has
a runbook paragraph in docs/monitoring.md.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.pytest_cluster import built_binary

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "charts" / "promptcache-operator" / "files" / "prometheus-rules.yaml"
UNIT_TESTS = Path(__file__).with_name("rules-test.yaml")
RUNBOOKS = ROOT / "docs" / "monitoring.md"


def alerts() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}


@pytest.fixture(scope="module")
def promtool() -> Path:
    return built_binary("promtool")


def run(promtool: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300, check=False)  # fmt: skip


@pytest.mark.prometheus
def test_rules_parse(promtool: Path) -> None:
    proc = run(promtool, "check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


@pytest.mark.prometheus
def test_rule_unit_tests_pass(promtool: Path) -> None:
    proc = run(promtool, "test", "rules", str(UNIT_TESTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.prometheus
def test_a_wrong_threshold_fails_the_unit_tests(promtool: Path, tmp_path: Path) -> None:
    rules = RULES.read_text()
    assert "evictions_per_insert:rate5m > 0.8" in rules
    (tmp_path / "rules.yaml").write_text(
        rules.replace("evictions_per_insert:rate5m > 0.8", "evictions_per_insert:rate5m > 0.99")
    )
    tests = yaml.safe_load(UNIT_TESTS.read_text())
    tests["rule_files"] = ["rules.yaml"]
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    proc = run(promtool, "test", "rules", "tests.yaml", cwd=tmp_path)
    assert proc.returncode != 0
    assert "PromptCachePromptEmbedsThrash" in proc.stdout + proc.stderr


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    cases: dict[str, set[bool]] = {name: set() for name in alerts()}
    for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        for check in test.get("alert_rule_test") or []:
            cases[check["alertname"]].add(bool(check["exp_alerts"]))
    assert {name: seen for name, seen in cases.items() if seen != {True, False}} == {}


def test_every_alert_has_a_runbook_paragraph() -> None:
    text = RUNBOOKS.read_text()
    sections = {part.split("\n", 1)[0].strip().lower(): part for part in text.split("\n### ")[1:]}
    for name, rule in alerts().items():
        doc, _, anchor = rule["annotations"]["runbook"].partition("#")
        assert doc == "docs/monitoring.md"
        assert anchor in sections, f"{name}: docs/monitoring.md has no '### ' heading #{anchor}"
        body = sections[anchor]
        assert name in body, f"the runbook section #{anchor} does not name {name}"
        assert len(body.split()) >= 40, f"the runbook of {name} is a stub"
