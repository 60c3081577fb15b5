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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from promptcache.api import (
    InvalidResourceError,
    OperatorDefaults,
    PromptCacheDeployment,
    parse_resource,
)
from promptcache.api.status import Reason
from promptcache.controller.children import owned
from promptcache.controller.observation import Problem
from promptcache.render import Names, RenderError, names_of, render, resolved

__all__ = ["Plan", "plan"]


@dataclass(frozen=True)
class Plan:
    """The render phase's result: the resolved resource, its names and its owned children."""

    pcd: PromptCacheDeployment
    """Resolved (`render.resolved`): what render rendered, operator defaults filled in."""
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
        pcd = resolved(parsed, defaults)
        names = names_of(pcd)
        desired = [owned(m, raw) for m in render(pcd, defaults)]
    except InvalidResourceError as error:
        return Problem(Reason.INVALID_SPEC, "; ".join(str(p) for p in error.problems))
    except RenderError as error:
        return Problem(error.reason, str(error))
    except KeyError as error:
        return Problem(Reason.INVALID_SPEC, f"missing {error.args[0]}")
    return Plan(pcd, names, desired)
