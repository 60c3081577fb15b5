"""Facts about the chart, the image and the docs that need no helm binary.

Each check here guards a promise that would otherwise drift silently: the chart ships the
same CRD as `crds/`, its default image is what the Dockerfile publishes, its values file
obeys its own schema, and the RBAC rules exist in exactly one file.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from promptcache._version import __version__
from promptcache.api.constants import (
    DEFAULT_FRONT_IMAGE,
    FRONT_IMAGE_REPOSITORY,
    OPERATOR_IMAGE_REPOSITORY,
)
from promptcache.contract import DEFAULT_IMAGE_REGISTRY, PROFILES, PickerTarget
from tools import install_assets

ROOT = Path(__file__).resolve().parents[2]

CHART = ROOT / "charts" / "promptcache-operator"
OPERATOR_IMAGE = "ghcr.io/promptcache/promptcache-operator"


def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return loaded


def values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return loaded


def test_chart_crd_template_is_the_generated_crd() -> None:
    """The chart's CRD is a template (so `helm upgrade` upgrades it) holding crds/ as is."""
    assert not (CHART / "crds").exists(), "Helm never upgrades crds/: the CRD is a template"
    template = (CHART / "templates" / "crds.yaml").read_text()
    plain = "\n".join(line for line in template.splitlines() if "{{" not in line)
    plain = plain.replace("  annotations:\n    helm.sh/resource-policy: keep\n", "")
    body = plain[plain.index("---") :]
    (generated,) = [p.read_text() for p in (ROOT / "crds").glob("*.yaml")]
    assert yaml.safe_load(body) == yaml.safe_load(generated), "run tools/install_assets.py"
    assert "{{- if .Values.crds.install }}" in template
    assert "{{- if .Values.crds.keep }}" in template


def test_chart_version_is_the_operator_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    assert chart["version"] == __version__


def test_default_images_are_what_the_dockerfile_publishes() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    published = dict(re.findall(r"docker build --target (\w+)\s+-t (\S+) \.", dockerfile))
    assert published == {
        "operator": f"{OPERATOR_IMAGE}:{__version__}",
        "front": f"ghcr.io/promptcache/promptcache-front:{__version__}",
        "picker": PROFILES[PickerTarget.PROMPTCACHE].image,
    }
    # The chart's defaults (tag empty = appVersion) and the renderer's built-in ones agree.
    image = values()["image"]
    assert image == {
        "registry": DEFAULT_IMAGE_REGISTRY,
        "repository": OPERATOR_IMAGE_REPOSITORY,
        "tag": "",
        "digest": "",
        "pullPolicy": "IfNotPresent",
    }
    assert f"{image['registry']}/{image['repository']}" == OPERATOR_IMAGE
    front = values()["defaultImages"]["front"]
    assert front == {
        "registry": "",
        "repository": FRONT_IMAGE_REPOSITORY,
        "tag": "",
        "digest": "",
    }
    assert published["front"] == DEFAULT_FRONT_IMAGE
    # The gateway policy step runs from the operator image unless a repository is named.
    assert values()["defaultImages"]["gatewayPolicy"]["repository"] == ""


def _stages(dockerfile: str) -> dict[str, str]:
    """Stage name -> its instructions (continuation lines joined)."""
    text = dockerfile.replace("\\\n", " ")
    stages: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        match = re.match(r"FROM\s+(?:--\S+\s+)*\S+\s+AS\s+(\S+)", line, re.IGNORECASE)
        if match:
            current = match.group(1)
            stages[current] = ""
        elif current is not None and not line.lstrip().startswith("#"):
            stages[current] += line + "\n"
    return stages


def test_dockerfile_keeps_torch_out_of_the_operator_image() -> None:
    stages = _stages((ROOT / "Dockerfile").read_text())
    # The default target (the last stage) is the operator.
    assert list(stages)[-1] == "operator"
    assert "--from=build-operator" in stages["operator"]
    assert "--from=build-front" in stages["front"]
    for name in ("build-base", "build-operator", "runtime", "operator"):
        assert "torch" not in stages[name], f"stage {name} mentions torch"
        assert "[front]" not in stages[name], f"stage {name} installs the front extra"
    assert 'pip install ".[front]"' in stages["build-front"]
    assert "torch" in stages["build-front"]
    assert 'pip install ".[gateway]"' in stages["build-operator"]


def test_the_gateway_policy_step_runs_from_the_operator_image() -> None:
    """The renderer's default policy-step image is the operator image, which carries its
    extra; the step's removed old command name is not a command."""
    from promptcache.api.constants import DEFAULT_GATEWAY_POLICY_IMAGE
    from promptcache.cli import build_parser

    assert f"{OPERATOR_IMAGE}:{__version__}" == DEFAULT_GATEWAY_POLICY_IMAGE
    assert build_parser().parse_args(["gateway-policy"]).command == "gateway-policy"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["session-shim"])
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert not any("torch" in dep for dep in extras["gateway"])


def test_images_declare_a_numeric_non_root_user_so_pods_fix_no_uid() -> None:
    """runAsNonRoot needs a numeric USER in the image; then no pod spec needs a UID."""
    stages = _stages((ROOT / "Dockerfile").read_text())
    picker = re.search(r"^USER (\d+):(\d+)$", stages["picker"], re.MULTILINE)
    assert picker is not None, "the picker runs as a numeric user too"
    assert int(picker.group(1)) != 0
    assert "CGO_ENABLED=0" in stages["build-picker"]  # static: its base has no libc, no shell
    user = re.search(r"^USER (\d+):(\d+)$", stages["runtime"], re.MULTILINE)
    assert user is not None, "the runtime stage must set a numeric non-root USER"
    uid, gid = int(user.group(1)), int(user.group(2))
    assert uid != 0
    assert gid != 0
    deployment = (CHART / "templates" / "deployment.yaml").read_text()
    assert "runAsNonRoot: true" in deployment
    assert "runAsUser" not in deployment


def test_dockerignore_sends_only_the_package_sources() -> None:
    lines = [
        line
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert lines[0] == "*"
    assert {line[1:] for line in lines if line.startswith("!")} == {
        "pyproject.toml",
        "README.md",
        "operator/",
        "picker/",
    }


def test_rbac_rules_come_from_the_one_rules_file() -> None:
    templates = {p.name: p.read_text() for p in (CHART / "templates").glob("*")}
    readers = sorted(name for name, text in templates.items() if ".Files.Get" in text)
    # The monitoring templates read their own files (the rules and the dashboard).
    assert readers == ["_helpers.tpl", "dashboard-configmap.yaml", "prometheusrule.yaml"]
    assert "clusterrole-rules" not in templates["prometheusrule.yaml"]
    assert "clusterrole-rules" not in templates["dashboard-configmap.yaml"]
    assert '.Files.Get "files/clusterrole-rules.yaml"' in templates["_helpers.tpl"]
    assert 'include "promptcache-operator.rules"' in templates["clusterrole.yaml"]
    # No rule is spelled out in any template: the rules file is the only source. (Templates
    # select subsets of it by resource; no template names a verb.)
    verbs = ("get", "list", "watch", "create", "update", "patch", "delete", "*")
    for path in (CHART / "templates").glob("*"):
        text = path.read_text()
        assert not re.search(r"^\s*-?\s*verbs:\s*\S", text, re.MULTILINE), path.name
        for verb in verbs:
            assert f'"{verb}"' not in text, f"{path.name} names the verb {verb}"


def test_default_values_obey_the_schema() -> None:
    jsonschema.Draft7Validator.check_schema(schema())
    jsonschema.Draft7Validator(schema()).validate(values())


@pytest.mark.parametrize("value_set", sorted((ROOT / "tests/chart/values").glob("*.yaml")))
def test_value_sets_obey_the_schema(value_set: Path) -> None:
    jsonschema.Draft7Validator(schema()).validate(yaml.safe_load(value_set.read_text()))


def test_every_value_is_documented_in_the_schema() -> None:
    documented = {key for key, _ in install_assets._leaves(schema())}
    in_values = install_assets._value_leaves(values(), schema())
    assert in_values <= documented
    table = install_assets.values_table()
    for key in in_values:
        assert f"| `{key}` |" in table


def test_install_doc_holds_the_current_values_table() -> None:
    doc = (ROOT / "docs" / "install.md").read_text()
    assert install_assets.values_table() in doc, "run tools/install_assets.py"


def test_values_table_rejects_an_undocumented_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chart = tmp_path / "chart"
    chart.mkdir()
    (chart / "values.schema.json").write_text(json.dumps(schema()))
    (chart / "values.yaml").write_text(yaml.safe_dump({**values(), "replicaCount": 2}))
    monkeypatch.setattr(install_assets, "CHART", chart)
    with pytest.raises(
        install_assets.StaleError, match=r"values\.yaml keys without a schema entry: replicaCount$"
    ):
        install_assets.values_table()


def test_rendered_front_container_runs_on_the_front_images_entrypoint() -> None:
    """The renderer gives the front only args; the image's ENTRYPOINT must make them a command."""
    from promptcache.cli import build_parser
    from promptcache.loading import load_resources
    from promptcache.render import render

    (pcd,) = load_resources((ROOT / "examples" / "minimal.yaml").read_text(), source="minimal")
    fronts = [
        c
        for m in render(pcd)
        if m["kind"] == "Deployment"
        for c in m["spec"]["template"]["spec"]["containers"]
        if c["image"] == DEFAULT_FRONT_IMAGE
    ]
    assert len(fronts) == 1
    (front,) = fronts
    assert "command" not in front
    stages = _stages((ROOT / "Dockerfile").read_text())
    assert 'ENTRYPOINT ["promptcache"]' in stages["runtime"]
    assert build_parser().parse_args(front["args"]).command == "front"


def test_one_version_everywhere() -> None:
    """The package version is the one source: chart, default image tags, release tag."""
    from promptcache.api.constants import DEFAULT_GATEWAY_POLICY_IMAGE

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == __version__
    # Empty tags mean appVersion in the chart; the renderer's built-ins carry the version.
    assert values()["image"]["tag"] == ""
    assert {v["tag"] for v in values()["defaultImages"].values()} == {""}
    assert DEFAULT_FRONT_IMAGE.endswith(f":{__version__}")
    assert DEFAULT_GATEWAY_POLICY_IMAGE.endswith(f":{__version__}")
    # The release workflow refuses a tag other than v<package version>, and publishes the
    # Dockerfile's two targets under the names the chart and the renderer default to.
    release = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yaml").read_text())
    steps = release["jobs"]["version"]["steps"]
    script = next(s["run"] for s in steps if s.get("id") == "v")
    assert "operator/promptcache/_version.py" in script
    assert 'if [ "$TAG" != "v$version" ]' in script
    images = release["jobs"]["images"]
    assert (
        set(images["strategy"]["matrix"]["target"])
        == {"operator", "front", "picker"}
        <= set(_stages((ROOT / "Dockerfile").read_text()))
    )
    assert images["env"]["IMAGE"].endswith(
        "/promptcache-${{ matrix.target }}:${{ needs.version.outputs.version }}"
    )
    assert {OPERATOR_IMAGE_REPOSITORY, FRONT_IMAGE_REPOSITORY} == {
        "promptcache-operator",
        "promptcache-front",
    }
