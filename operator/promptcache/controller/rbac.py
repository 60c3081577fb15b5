"""The operator's RBAC, built from the rules files shipped inside this package.

`promptcache/controller/rbac_rules/` (package data, so it is there in a wheel and in the
image) holds the single source of the operator's rules: `clusterrole-rules.yaml` (its
ClusterRole) and `leader-election-rules.yaml` (its Role for the leader Lease in its own
namespace). The pickers' static ClusterRole comes from `render/epp.py` (`picker_rules`).
`tools/install_assets.py` copies all three into the Helm chart's `files/`, which reads
them with `.Files.Get`; `promptcache rbac` prints them, and the RBAC tests run the
operator under exactly them.
"""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Final

import yaml

CLUSTER_ROLE_NAME: Final[str] = "promptcache-operator"
RULES_DIR: Final[str] = "rbac_rules"
"""The package-data folder beside this module."""
RULES_FILE: Final[str] = "clusterrole-rules.yaml"
LEADER_RULES_FILE: Final[str] = "leader-election-rules.yaml"
PICKER_RULES_FILE: Final[str] = "endpoint-picker-rules.yaml"
PICKER_ROLE_PLACEHOLDER: Final[str] = "ENDPOINT_PICKER_CLUSTER_ROLE"
"""Stands for the picker ClusterRole's name in the rules file (the chart names it)."""


def picker_role_name(operator_role: str = CLUSTER_ROLE_NAME) -> str:
    """The chart's naming: `<fullname>-endpoint-picker`."""
    return f"{operator_role}-endpoint-picker"


def rules_file(name: str = RULES_FILE) -> Traversable:
    """A rules file of the package (works from a wheel, a zip or the source tree)."""
    return files("promptcache.controller").joinpath(RULES_DIR, name)


def load_rules(
    path: Path | Traversable | None = None, *, picker_role: str | None = None
) -> list[dict[str, Any]]:
    """A rules file as PolicyRules (the package's ClusterRole rules unless `path` is given);
    `picker_role` replaces the picker ClusterRole placeholder."""
    text = (path or rules_file()).read_text(encoding="utf-8")
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
    return _role("Role", f"{name}-leader-election", load_rules(rules_file(LEADER_RULES_FILE)))


def picker_cluster_role(name: str = CLUSTER_ROLE_NAME) -> dict[str, Any]:
    """The pickers' static ClusterRole, bound per namespace by the operator."""
    from promptcache.render.epp import picker_rules  # noqa: PLC0415 - the renderer owns them

    return _role("ClusterRole", picker_role_name(name), picker_rules())
