"""`podTemplate`: what a platform team adds to a rendered pod, merged the way
`kubectl patch --type strategic` would (maps merged, lists merged by their key).

The operator's own parts of the pod (the engine's command and ports, the other containers,
probes, its volumes, env and selector labels) cannot be overridden: the rules in
`api/rules.py` refuse such an overlay with a message naming the field, at the API server and
in the CLI alike.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, WithJsonSchema, model_validator

from promptcache.api.base import ApiModel
from promptcache.api.k8s import (
    Affinity,
    EnvVar,
    LocalObjectReference,
    TopologySpreadConstraint,
    Volume,
    VolumeMount,
)
from promptcache.api.rules import enforce_rules

_ANY_OBJECT = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
OwnedObject = Annotated[Any, WithJsonSchema(_ANY_OBJECT)]
"""A container field the operator owns: in the schema (typed, so CEL can see it) only so the
rules can refuse it by name."""
OwnedStrings = Annotated[Any, WithJsonSchema({"type": "array", "items": {"type": "string"}})]
OwnedString = Annotated[Any, WithJsonSchema({"type": "string"})]
OwnedObjects = Annotated[Any, WithJsonSchema({"type": "array", "items": _ANY_OBJECT})]
Name = Annotated[str, Field(min_length=1, max_length=253)]


class PodMetadataOverlay(ApiModel):
    """Labels and annotations added to the pod (e.g. for a service mesh or cost tooling)."""

    labels: Annotated[dict[str, Annotated[str, Field(max_length=63)]], Field(max_length=64)] = (
        Field(default_factory=dict)
    )
    annotations: Annotated[dict[str, str], Field(max_length=64)] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _rules(self) -> PodMetadataOverlay:
        return enforce_rules(self, "podMetadata")


class _ContainerOverlay(ApiModel):
    """Additions to the operator's main container of the pod."""

    name: Name
    """The container to extend."""
    env: Annotated[list[EnvVar], Field(max_length=64)] = Field(default_factory=list)
    """Environment variables added (or replacing ones of the same name from engine.env)."""
    volume_mounts: Annotated[list[VolumeMount], Field(max_length=32)] = Field(default_factory=list)
    """Mounts of podTemplate.spec.volumes (or of the operator's volumes)."""
    command: OwnedStrings = None
    """Refused: the operator owns it."""
    args: OwnedStrings = None
    """Refused: the operator owns it."""
    image: OwnedString = None
    """Refused: the operator owns it."""
    ports: OwnedObjects = None
    """Refused: the operator owns it."""
    liveness_probe: OwnedObject = None
    """Refused: the operator owns it."""
    readiness_probe: OwnedObject = None
    """Refused: the operator owns it."""
    startup_probe: OwnedObject = None
    """Refused: the operator owns it."""
    resources: OwnedObject = None
    """Refused: the operator owns it."""
    security_context: OwnedObject = None
    """Refused: the operator owns it."""


class ModelContainerOverlay(_ContainerOverlay):
    """Additions to the `vllm` container."""

    @model_validator(mode="after")
    def _rules(self) -> ModelContainerOverlay:
        return enforce_rules(self, "modelContainer")


class GatewayContainerOverlay(_ContainerOverlay):
    """Additions to the `epp` container."""

    @model_validator(mode="after")
    def _rules(self) -> GatewayContainerOverlay:
        return enforce_rules(self, "gatewayContainer")


class _PodSpecOverlay(ApiModel):
    """Scheduling and volumes added to the pod."""

    affinity: Affinity | None = None
    """Node and pod (anti-)affinity, as in a PodSpec."""
    topology_spread_constraints: Annotated[list[TopologySpreadConstraint], Field(max_length=8)] = (
        Field(default_factory=list)
    )
    """Spread of the pods over zones or nodes, as in a PodSpec."""
    image_pull_secrets: Annotated[list[LocalObjectReference], Field(max_length=8)] = Field(
        default_factory=list
    )
    """Secrets to pull private images with."""
    priority_class_name: Name | None = None
    runtime_class_name: Name | None = None
    scheduler_name: Name | None = None
    volumes: Annotated[list[Volume], Field(max_length=32)] = Field(default_factory=list)
    """Extra volumes; mount them with containers[].volumeMounts."""


class ModelPodSpecOverlay(_PodSpecOverlay):
    containers: Annotated[list[ModelContainerOverlay], Field(max_length=2)] = Field(
        default_factory=list
    )
    """Additions to the `vllm` container (env, volumeMounts); no other container."""

    @model_validator(mode="after")
    def _rules(self) -> ModelPodSpecOverlay:
        return enforce_rules(self, "modelPodSpec")


class GatewayPodSpecOverlay(_PodSpecOverlay):
    containers: Annotated[list[GatewayContainerOverlay], Field(max_length=2)] = Field(
        default_factory=list
    )
    """Additions to the `epp` container (env, volumeMounts); no other container."""

    @model_validator(mode="after")
    def _rules(self) -> GatewayPodSpecOverlay:
        return enforce_rules(self, "gatewayPodSpec")


class ModelPodTemplate(ApiModel):
    """Merged onto each model-server pod."""

    metadata: PodMetadataOverlay = Field(default_factory=PodMetadataOverlay)
    spec: ModelPodSpecOverlay = Field(default_factory=ModelPodSpecOverlay)


class GatewayPodTemplate(ApiModel):
    """Merged onto each Endpoint Picker pod."""

    metadata: PodMetadataOverlay = Field(default_factory=PodMetadataOverlay)
    spec: GatewayPodSpecOverlay = Field(default_factory=GatewayPodSpecOverlay)
