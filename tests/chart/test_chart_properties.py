"""Properties of the chart over generated values, checked with the real helm binary.

- helm's schema check and a standard JSON-Schema validator agree on every value set, so
  values.schema.json means what it says (no helm-specific leniency a user could trip on);
- for any list of watched namespaces, RBAC follows the list exactly and the operator's own
  parser reads back the same namespaces from the chart's command line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from promptcache.cli import build_parser
from tools import install_assets

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.helm

CHART = ROOT / "charts" / "promptcache-operator"
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
# Each example runs helm once (0.2-0.6 s on a loaded machine): few examples, no slow suite.
HELM_SETTINGS = settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

namespace_names = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?\Z")

values_sets = st.fixed_dictionaries(
    {},
    optional={
        "replicas": st.one_of(st.integers(-2, 8), st.sampled_from(["2", 1.5, None])),
        "logLevel": st.sampled_from(["debug", "info", "warning", "error", "INFO", "trace", 3]),
        "watch": st.fixed_dictionaries(
            {"namespaces": st.lists(st.sampled_from(["a", "b", "Bad_NS", "team-x"]), max_size=3)}
        ),
        "metrics": st.fixed_dictionaries(
            {"port": st.sampled_from([80, 1023, 1024, 9090, 65535, 65536, "9090"])}
        ),
        "image": st.fixed_dictionaries(
            {"pullPolicy": st.sampled_from(["Always", "IfNotPresent", "Never", "always"])}
        ),
        "resources": st.fixed_dictionaries(
            {
                "limits": st.fixed_dictionaries(
                    {"memory": st.sampled_from(["512Mi", "1G", "lots", 5])}
                )
            }
        ),
    },
)


DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())


def merged(defaults: Any, user: Any) -> Any:
    """Helm's coalescing: user maps merge into defaults; a user `null` deletes the key."""
    if not (isinstance(defaults, dict) and isinstance(user, dict)):
        return user
    out = dict(defaults)
    for key, value in user.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merged(defaults.get(key), value)
    return out


def schema_accepts(values: dict[str, Any]) -> bool:
    """What a standard validator says of the values helm validates (defaults + user)."""
    return bool(jsonschema.Draft7Validator(SCHEMA).is_valid(merged(DEFAULTS, values)))


@HELM_SETTINGS
@given(values=values_sets)
def test_helm_and_the_schema_agree(values: dict[str, Any], tmp_path_factory: Any) -> None:
    path = tmp_path_factory.mktemp("values") / "values.json"
    path.write_text(json.dumps(values))
    proc = install_assets.helm("template", "x", str(CHART), "-f", str(path), check=False)
    schema_error = "values don't meet the specifications of the schema" in proc.stderr
    assert schema_error is not schema_accepts(values), proc.stderr
    if not schema_error:
        # Past the schema, only the chart's own consistency checks may refuse.
        assert proc.returncode == 0 or "execution error" in proc.stderr, proc.stderr


@HELM_SETTINGS
@given(namespaces=st.lists(namespace_names, min_size=1, max_size=4, unique=True))
def test_rbac_and_command_line_follow_the_watched_namespaces(
    namespaces: list[str], tmp_path_factory: Any
) -> None:
    # A JSON values file: `--set watch.namespaces={0}` makes 0 a number, and helm's YAML 1.1
    # reads an unquoted `y` as a boolean. JSON strings are always strings.
    path = tmp_path_factory.mktemp("values") / "values.json"
    path.write_text(json.dumps({"watch": {"namespaces": namespaces}}))
    docs = [d for d in yaml.safe_load_all(install_assets.helm_template("-f", str(path))) if d]
    full_role_bindings = sorted(
        d["metadata"]["namespace"]
        for d in docs
        if d["kind"] == "RoleBinding" and d["roleRef"]["kind"] == "ClusterRole"
    )
    assert full_role_bindings == sorted(namespaces)
    full_cluster_bindings = [
        d
        for d in docs
        if d["kind"] == "ClusterRoleBinding" and d["roleRef"]["name"] == "promptcache-operator"
    ]
    assert full_cluster_bindings == []
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(container["args"])
    assert args.namespaces == namespaces
    assert not args.all_namespaces
