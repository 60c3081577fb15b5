"""Kubernetes Events on condition transitions, posted with the operator's own client.

Posted directly (core/v1 Event, named `<resource>.<random>` like kubectl's) rather than
through kopf, so every path that reconciles (kopf handlers and the resyncer task) can
post them. A failed post is logged and dropped: an Event is never worth a retry storm.
"""

from __future__ import annotations

import datetime
import logging
import secrets
from collections.abc import Mapping
from typing import Any

from promptcache.controller.errors import ApiError
from promptcache.controller.kube import Kube, by_kind

log = logging.getLogger(__name__)
EVENT = by_kind("Event")
COMPONENT = "promptcache-operator"


def event_manifest(
    obj: Mapping[str, Any], *, type_: str, reason: str, message: str, instance: str
) -> dict[str, Any]:
    meta = obj.get("metadata", {})
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{meta.get('name')}.{secrets.token_hex(8)}",
            "namespace": meta.get("namespace"),
        },
        "involvedObject": {
            "apiVersion": obj.get("apiVersion"),
            "kind": obj.get("kind"),
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
        },
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance[:128],
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


async def post_event(
    kube: Kube, obj: Mapping[str, Any], *, type_: str, reason: str, message: str, instance: str
) -> None:
    manifest = event_manifest(obj, type_=type_, reason=reason, message=message, instance=instance)
    try:
        await kube.create(manifest)
    except (ApiError, OSError) as error:
        log.debug("could not post event %s: %s", reason, error)
