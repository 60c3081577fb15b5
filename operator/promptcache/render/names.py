"""Names and labels of every child, derived from the resource in one place.

Selectors are built from these labels and are immutable once a Deployment
exists, so they use only labels the operator controls (never the parent's own
labels, which `kopf.adopt` would copy).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from promptcache._version import __version__
from promptcache.api import PromptCacheDeployment

MANAGED_BY: Final[str] = "promptcache"
_DNS_1035: Final = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LONGEST_SUFFIX: Final[str] = "-epp"
MAX_NAME_LENGTH: Final[int] = 63 - len(_LONGEST_SUFFIX)


class RenderError(ValueError):
    """The resource is valid but cannot be realised; the message names the field and the fix."""

    def __init__(self, field: str, message: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {message}")


class Component:
    MODEL_SERVER: Final[str] = "model-server"
    ENDPOINT_PICKER: Final[str] = "endpoint-picker"
    GATEWAY: Final[str] = "gateway"
    ISOLATION: Final[str] = "isolation"


@dataclass(frozen=True)
class Names:
    """Every name the renderer and the controller give to a child of one resource."""

    instance: str
    namespace: str

    @property
    def model_server(self) -> str:
        return self.instance

    @property
    def pool(self) -> str:
        return self.instance

    @property
    def route(self) -> str:
        return self.instance

    @property
    def epp(self) -> str:
        return f"{self.instance}{_LONGEST_SUFFIX}"

    @property
    def model_map(self) -> str:
        """The body-based router's ConfigMap: the served model and its adapters."""
        return f"{self.instance}-bbr"

    @property
    def salt_secret(self) -> str:
        return f"{self.instance}-salt"


def names_of(pcd: PromptCacheDeployment) -> Names:
    """Derive the names, refusing a resource name the children could not carry."""
    name = pcd.metadata.name
    if len(name) > MAX_NAME_LENGTH:
        raise RenderError(
            "metadata.name",
            f"{name!r} is {len(name)} characters; derived names such as {name + _LONGEST_SUFFIX!r} "
            f"must fit 63, so use at most {MAX_NAME_LENGTH}",
            reason="NameTooLong",
        )
    if not _DNS_1035.match(name):
        raise RenderError(
            "metadata.name",
            f"{name!r} must start with a letter and contain only lower-case letters, digits "
            "and '-': it also names Services",
            reason="InvalidName",
        )
    return Names(instance=name, namespace=pcd.metadata.namespace)


def selector_labels(names: Names, component: str) -> dict[str, str]:
    """The immutable labels a selector matches; a subset of `labels()`."""
    return {
        "app.kubernetes.io/name": "promptcache",
        "app.kubernetes.io/instance": names.instance,
        "app.kubernetes.io/component": component,
    }


def labels(names: Names, component: str) -> dict[str, str]:
    """Labels on every child: the recommended `app.kubernetes.io/*` set."""
    return {
        **selector_labels(names, component),
        "app.kubernetes.io/part-of": "promptcache",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "app.kubernetes.io/version": __version__,
    }


def metadata(names: Names, name: str, component: str) -> dict[str, object]:
    return {"name": name, "namespace": names.namespace, "labels": labels(names, component)}
