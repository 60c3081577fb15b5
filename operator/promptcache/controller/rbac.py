"""The operator's RBAC, built from the rules files the Helm chart also includes.

`charts/promptcache-operator/files/` holds the single source of every rule:
`clusterrole-rules.yaml` (the operator's ClusterRole), `leader-election-rules.yaml`
(its Role for the leader Lease in its own namespace) and `endpoint-picker-rules.yaml`
(the pickers' static ClusterRole, generated from `render/epp.py` by
`tools/install_assets.py`). The chart reads them with `.Files.Get`, `promptcache rbac`
prints them, and the RBAC tests run the operator under exactly them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import yaml

CLUSTER_ROLE_NAME: Final[str] = "promptcache-operator"
FILES_RELATIVE: Final[str] = "charts/promptcache-operator/files"
RULES_FILE: Final[str] = "clusterrole-rules.yaml"
LEADER_RULES_FILE: Final[str] = "leader-election-rules.yaml"
PICKER_RULES_FILE: Final[str] = "endpoint-picker-rules.yaml"
PICKER_ROLE_PLACEHOLDER: Final[str] = "ENDPOINT_PICKER_CLUSTER_ROLE"
"""Stands for the picker ClusterRole's name in the rules file (the chart names it)."""
RULES_RELATIVE: Final[str] = f"{FILES_RELATIVE}/{RULES_FILE}"


def picker_role_name(operator_role: str = CLUSTER_ROLE_NAME) -> str:
    """The chart's naming: `<fullname>-endpoint-picker`."""
    return f"{operator_role}-endpoint-picker"


def files_dir() -> Path:
    """The chart's files/ of the source tree this package was installed from (editable)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / FILES_RELATIVE
        if (candidate / RULES_FILE).is_file():
            return candidate
    raise FileNotFoundError(f"{RULES_RELATIVE} not found above {here}")


def rules_path() -> Path:
    return files_dir() / RULES_FILE


def load_rules(path: Path | None = None, *, picker_role: str | None = None) -> list[dict[str, Any]]:
    """A rules file as PolicyRules; `picker_role` replaces the picker ClusterRole placeholder."""
    text = (path or rules_path()).read_text(encoding="utf-8")
    text = text.replace(PICKER_ROLE_PLACEHOLDER, picker_role or picker_role_name())
    data = yaml.safe_load(text)
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise ValueError("the rules file must be a YAML list of PolicyRules")
    return data


def _role(kind: str, name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "promptcache-operator"}},
        "rules": rules,
    }


def cluster_role(name: str = CLUSTER_ROLE_NAME, path: Path | None = None) -> dict[str, Any]:
    """The operator's ClusterRole; its `bind` names the picker role `<name>-endpoint-picker`."""
    return _role("ClusterRole", name, load_rules(path, picker_role=picker_role_name(name)))


def leader_election_role(name: str = CLUSTER_ROLE_NAME) -> dict[str, Any]:
    """The Role for the leader Lease (put it in the operator's own namespace)."""
    return _role("Role", f"{name}-leader-election", load_rules(files_dir() / LEADER_RULES_FILE))


def picker_cluster_role(name: str = CLUSTER_ROLE_NAME) -> dict[str, Any]:
    """The pickers' static ClusterRole, bound per namespace by the operator."""
    from promptcache.render.epp import picker_rules  # noqa: PLC0415 - the renderer owns them

    return _role("ClusterRole", picker_role_name(name), picker_rules())
