"""The render phase of a reconcile (pure): a resource body in, a `Plan` out.

The body is parsed, resolved against the operator-wide defaults (`render.resolved`),
named and rendered; each child gets its ownerReference and hash annotation
(`children.owned`). Every later phase reads the plan's resolved resource, so the
status describes what render deployed. A resource that cannot be rendered gives
the `Problem` to report instead (`Degraded`), and nothing is applied.

    >>> planned = plan(body, BUILT_IN_DEFAULTS)
    >>> planned.renders("Deployment", planned.names.model_server)
    True
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from promptcache.api import (
    InvalidResourceError,
    OperatorDefaults,
    ResolvedDeployment,
    parse_resource,
)
from promptcache.api.status import Reason
from promptcache.controller.children import owned
from promptcache.controller.observation import Problem
from promptcache.render import Names, RenderError, names_of, render, resolved

__all__ = ["Plan", "PlanMemo", "plan"]


@dataclass(frozen=True)
class Plan:
    """The render phase's result: the resolved resource, its names and its owned children."""

    pcd: ResolvedDeployment
    """Resolved (`api.resolved`): what render rendered, operator defaults filled in; every
    later phase (status included) reads this, never a default."""
    names: Names
    desired: list[dict[str, Any]]

    def renders(self, kind: str, name: str | None = None) -> bool:
        """Whether a child of `kind` (named `name`, if given) is rendered."""
        return any(
            m["kind"] == kind and (name is None or m["metadata"]["name"] == name)
            for m in self.desired
        )


def plan(raw: Mapping[str, Any], defaults: OperatorDefaults) -> Plan | Problem:
    """Render phase (pure): the plan, or why the resource cannot be rendered at all."""
    try:
        parsed = parse_resource({k: raw[k] for k in ("apiVersion", "kind", "metadata", "spec")})
        pcd = resolved(parsed, defaults)  # the only place the operator's defaults are read
        names = names_of(pcd)
        desired = [owned(m, raw) for m in render(pcd)]
    except InvalidResourceError as error:
        return Problem(Reason.INVALID_SPEC, "; ".join(str(p) for p in error.problems))
    except RenderError as error:
        return Problem(error.reason, str(error))
    except KeyError as error:
        return Problem(Reason.INVALID_SPEC, f"missing {error.args[0]}")
    return Plan(pcd, names, desired)


_VOLATILE = ("resourceVersion", "managedFields")
"""Metadata a status write or a field-manager change moves, which render never reads."""


def plan_key(raw: Mapping[str, Any]) -> str:
    """Everything `plan` reads from a body, as one string: equal keys, equal plans."""
    meta = {k: v for k, v in (raw.get("metadata") or {}).items() if k not in _VOLATILE}
    inputs = [raw.get("apiVersion"), raw.get("kind"), meta, raw.get("spec")]
    return json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=str)


@dataclass
class PlanMemo:
    """The last plan of each resource, reused while its inputs are unchanged.

    Render is pure, so a body whose spec and metadata did not move renders the very same
    children; at 2,000 resources re-rendering each one every resync (the picker's YAML
    config twice, the owner references and hashes) was most of an idle operator's CPU.
    One entry per resource (about 60 KiB); the plans are never mutated by the phases."""

    defaults: OperatorDefaults
    _plans: dict[str, tuple[str, Plan | Problem]] = field(default_factory=dict)

    def get(self, uid: str, raw: Mapping[str, Any]) -> tuple[str, Plan | Problem]:
        """(the inputs' key, the plan): the stored one when the key is unchanged."""
        key = plan_key(raw)
        found = self._plans.get(uid)
        if found is not None and found[0] == key:
            return found
        self._plans[uid] = (key, plan(raw, self.defaults))
        return self._plans[uid]

    def forget(self, uid: str) -> None:
        self._plans.pop(uid, None)
