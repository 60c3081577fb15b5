"""The operator's ClusterRole, built from the one rules file the Helm chart also includes.

`charts/promptcache-operator/files/clusterrole-rules.yaml` is the single source
of the rules: the chart reads it with `.Files.Get`, `promptcache rbac` prints
it as a ClusterRole, and the RBAC test runs the operator under exactly it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import yaml

CLUSTER_ROLE_NAME: Final[str] = "promptcache-operator"
RULES_RELATIVE: Final[str] = "charts/promptcache-operator/files/clusterrole-rules.yaml"


def rules_path() -> Path:
    """The rules file of the source tree this package was installed from (editable installs)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / RULES_RELATIVE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{RULES_RELATIVE} not found above {here}")


def load_rules(path: Path | None = None) -> list[dict[str, Any]]:
    data = yaml.safe_load((path or rules_path()).read_text(encoding="utf-8"))
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise ValueError("the rules file must be a YAML list of PolicyRules")
    return data


def cluster_role(name: str = CLUSTER_ROLE_NAME, path: Path | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/name": "promptcache-operator"},
        },
        "rules": load_rules(path),
    }
