"""Operator-wide defaults: what the renderer uses where a resource leaves a field empty.

One small typed object, set once per operator (the chart's `defaultImages` values become
`promptcache run` flags) or per `promptcache render` call (the same flags), and passed
to the renderer. A resource field, when set, always wins. The built-in values follow the
package version, so an unconfigured operator deploys the images released with it.

    >>> OperatorDefaults().front_image == DEFAULT_FRONT_IMAGE
    True
    >>> OperatorDefaults(front_image="registry.example/front:1").front_image
    'registry.example/front:1'
"""

from __future__ import annotations

import argparse
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from promptcache.api.base import ImageRef, ObjectName
from promptcache.api.constants import (
    DEFAULT_FRONT_IMAGE,
    DEFAULT_GATEWAY_POLICY_IMAGE,
    DEFAULT_MODEL_SERVER_USER,
)
from promptcache.api.spec import PickerName
from promptcache.contract import DEFAULT_PICKER, PickerTarget


class OperatorDefaults(BaseModel):
    """Defaults of one operator (or one `render` run) for fields a resource may omit."""

    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, use_attribute_docstrings=True
    )

    front_image: ImageRef = DEFAULT_FRONT_IMAGE
    """Cache-front image for resources without `spec.front.image`."""
    gateway_policy_image: ImageRef = DEFAULT_GATEWAY_POLICY_IMAGE
    """Gateway policy step image for resources without `spec.gateway.gatewayPolicyImage`."""
    endpoint_picker_cluster_role: ObjectName | None = None
    """The Endpoint Picker's static ClusterRole (the chart installs it); each picker gets a
    RoleBinding to it in its namespace. Empty: each picker gets a Role of its own (what
    `promptcache render` gives, for installs without the chart)."""
    picker: PickerName = DEFAULT_PICKER
    """Endpoint Picker for resources without `spec.gateway.picker`: `promptcache` (this
    release's own build of GIE v1.5.0's picker, no policy step in front), `llm-d-router`
    (v0.10.0) or `gie-v1.5` (the upstream GIE EPP v1.5.0); see docs/endpoint-picker.md."""
    model_server_user: Annotated[int, Field(ge=1, le=2**31 - 1)] | None = DEFAULT_MODEL_SERVER_USER
    """UID (and GID, fsGroup) of the vLLM container, whose upstream image declares no
    non-root user; `none` to leave it to the platform (OpenShift's restricted SCC assigns
    one). This project's images declare their own and get no UID."""
    pod_monitors: bool = False
    """Render PodMonitors (Prometheus Operator) for resources without
    `spec.monitoring.enabled`."""


BUILT_IN_DEFAULTS = OperatorDefaults()
"""What a renderer uses when nobody configured anything: the images of this release."""


_OPTIONAL_INTS = frozenset({"model_server_user"})
"""Integer fields a flag may unset with `none`."""
_NONE = frozenset({"", "none", "null"})
_METAVARS = {
    "model_server_user": "UID",
    "endpoint_picker_cluster_role": "NAME",
    "pod_monitors": "BOOL",
    "picker": "{" + ",".join(sorted(PickerTarget, key=lambda p: p != DEFAULT_PICKER)) + "}",
}


def flag_of(field: str) -> str:
    """`front_image` -> `--front-image`: every field is one flag of `run` and of `render`."""
    return "--" + field.replace("_", "-")


def add_default_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per field of OperatorDefaults, so `run` and `render` can never differ."""
    group = parser.add_argument_group(
        "operator-wide defaults", "used where a resource leaves the field empty"
    )
    for name, info in OperatorDefaults.model_fields.items():
        group.add_argument(
            flag_of(name),
            dest=f"default_{name}",
            metavar=_METAVARS.get(name, "REF"),
            default=None,
            help=f"{info.description} (default: {info.default})",
        )


def defaults_from_args(args: argparse.Namespace) -> OperatorDefaults:
    """The defaults the flags give; ValueError naming the flag when a value is invalid."""
    given: dict[str, Any] = {}
    for name in OperatorDefaults.model_fields:
        value = getattr(args, f"default_{name}", None)
        if value is None:
            continue
        if name in _OPTIONAL_INTS:
            value = None if value.strip().lower() in _NONE else value
        given[name] = value
    try:
        return OperatorDefaults.model_validate(given, strict=False)
    except ValidationError as error:
        problems = [
            f"{flag_of(str(e['loc'][0]))}: {e['msg']} (got {e['input']!r})" for e in error.errors()
        ]
        raise ValueError("; ".join(problems)) from None
