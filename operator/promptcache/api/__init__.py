"""The PromptCacheDeployment API: typed models, cross-field rules and the generated CRD.

This package is the single source of truth for the resource. Everything else
(the CRD in `crds/`, the renderer, the docs table) derives from it.

    >>> from promptcache.api import parse_resource
    >>> pcd = parse_resource(yaml.safe_load(open("examples/minimal.yaml")))
    >>> pcd.spec.model.replicas
    1
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from promptcache.api.constants import API_VERSION, GROUP, KIND, PLURAL, VERSION
from promptcache.api.defaults import BUILT_IN_DEFAULTS, OperatorDefaults
from promptcache.api.errors import InvalidResourceError, Problem, problems_from
from promptcache.api.resolve import (
    OperatorFacts,
    ResolvedDeployment,
    UnresolvedError,
    filled,
    resolved,
)
from promptcache.api.resource import ObjectMeta, PromptCacheDeployment
from promptcache.api.sizing import PromptEmbedsCeiling, prompt_embeds_ceiling
from promptcache.api.spec import PromptCacheDeploymentSpec
from promptcache.api.status import (
    Condition,
    ConditionType,
    PromptCacheDeploymentStatus,
    Reason,
)

__all__ = [
    "API_VERSION",
    "BUILT_IN_DEFAULTS",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "Condition",
    "ConditionType",
    "InvalidResourceError",
    "ObjectMeta",
    "OperatorDefaults",
    "OperatorFacts",
    "Problem",
    "PromptCacheDeployment",
    "PromptCacheDeploymentSpec",
    "PromptCacheDeploymentStatus",
    "PromptEmbedsCeiling",
    "Reason",
    "ResolvedDeployment",
    "UnresolvedError",
    "ceiling_of",
    "filled",
    "parse_resource",
    "prompt_embeds_ceiling",
    "resolved",
]


def parse_resource(obj: Any) -> PromptCacheDeployment:
    """Validate a decoded YAML/JSON object as a PromptCacheDeployment.

    Raises InvalidResourceError listing every problem with its field path; the
    identity (apiVersion, kind) is checked first so a wrong document is named as such.
    """
    if not isinstance(obj, dict):
        raise InvalidResourceError([Problem("", "a resource must be a mapping (YAML object)")])
    identity = [
        Problem(key, f"must be {want!r}, got {obj.get(key)!r}")
        for key, want in (("apiVersion", API_VERSION), ("kind", KIND))
        if obj.get(key) != want
    ]
    if identity:
        raise InvalidResourceError(identity)
    try:
        return PromptCacheDeployment.model_validate(obj)
    except ValidationError as error:
        raise InvalidResourceError(problems_from(error)) from None


def ceiling_of(pcd: PromptCacheDeployment) -> PromptEmbedsCeiling:
    """The prompt-embeds memory ceiling of a resource, as the status reports it."""
    spec = pcd.spec
    return prompt_embeds_ceiling(
        enabled=spec.prompt_embeds.enabled and spec.front.enabled,
        cache_gib=spec.prompt_embeds.cache_gib,
        processes_per_pod=spec.engine.api_server_count,
        replicas=spec.model.replicas,
    )
