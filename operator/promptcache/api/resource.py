"""The whole resource: identity, metadata and spec, as read from YAML or the API server."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from promptcache.api.base import ApiModel, ObjectName
from promptcache.api.spec import PromptCacheDeploymentSpec
from promptcache.api.status import PromptCacheDeploymentStatus


class ObjectMeta(BaseModel):
    """The metadata render needs. Other metadata (set by the API server) is tolerated, not used."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)

    name: Annotated[str, Field(min_length=1, max_length=253)]
    namespace: ObjectName = "default"
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class PromptCacheDeployment(ApiModel):
    """A `PromptCacheDeployment`: one resource, a complete prompt-cache-aware serving stack."""

    # A type must spell its literal: tests/api keep these two equal to api.constants.
    api_version: Literal["serving.promptcache.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["PromptCacheDeployment"]
    metadata: ObjectMeta
    spec: PromptCacheDeploymentSpec
    status: PromptCacheDeploymentStatus | None = None
