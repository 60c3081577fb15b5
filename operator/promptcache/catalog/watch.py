"""The responder's view of the PromptCacheDeployments: one list, then a watch, kept in memory.

Why the responder watches the resources itself instead of the operator writing a list into
a ConfigMap per Gateway (docs/multi-model.md, "GET /v1/models"): the resources sharing a
Gateway live in several namespaces, and no one of them can own an object in the router's
namespace (an ownerReference never crosses namespaces), so such a ConfigMap would need its
own garbage collection and a writer racing every reconcile; a mounted ConfigMap reaches the
pod a minute late; and the operator would need write access where today it needs none.
Here the only privilege is `get`/`list`/`watch` on the resources, the list follows their
status within a watch event, and nothing is written anywhere.

The loop is the usual informer: list (which gives a resourceVersion), watch from it with
bookmarks, list again when the server says the version is gone (410) or the watch breaks
in a way a resumed watch cannot repair. A resource that does not parse (written by a newer
CRD) is left out and logged once per resourceVersion; one whose status does not parse is
kept without status (so: not ready, not listed).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from promptcache.api import InvalidResourceError, PromptCacheDeployment, parse_resource
from promptcache.controller.errors import GoneError
from promptcache.controller.kube import Kube, by_kind

log = logging.getLogger(__name__)

RESOURCE = by_kind("PromptCacheDeployment")
BACKOFF_S: Final = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
"""Waits between attempts after a failed list or watch, longest repeated."""


@dataclass(frozen=True)
class Entry:
    pcd: PromptCacheDeployment
    created: int | None
    """creationTimestamp in Unix seconds (the `created` of its `/v1/models` entries)."""


def _created(raw: Mapping[str, Any]) -> int | None:
    stamp = (raw.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(stamp, str):
        return None
    try:
        return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return None


def parse_entry(raw: Mapping[str, Any]) -> Entry | None:
    """The parsed resource, its status dropped if only the status does not parse; None if
    the resource itself does not (logged)."""
    try:
        return Entry(parse_resource(dict(raw)), _created(raw))
    except InvalidResourceError as error:
        if raw.get("status") is not None:
            try:
                bare = {k: v for k, v in raw.items() if k != "status"}
                return Entry(parse_resource(bare), _created(raw))
            except InvalidResourceError:
                pass
        meta = raw.get("metadata") or {}
        log.warning(
            "left %s/%s out of the model list: it does not parse (%s)",
            meta.get("namespace"),
            meta.get("name"),
            str(error)[:300],
        )
        return None


@dataclass
class ResourceCache:
    """The resources of some namespaces (empty: all), as the API server last said."""

    kube: Kube
    namespaces: tuple[str, ...] = ()
    entries: dict[tuple[str, str], Entry] = field(default_factory=dict)
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once every namespace was listed: before that, the responder is not ready."""
    version: int = 0
    """Bumped on every change (the responder's answers are cached per version)."""
    _listed: set[str | None] = field(default_factory=set)

    def resources(self) -> list[PromptCacheDeployment]:
        return [e.pcd for e in self.entries.values()]

    def created(self) -> dict[str, int]:
        return {f"{ns}/{name}": e.created for (ns, name), e in self.entries.items() if e.created}

    def _replace(self, namespace: str | None, items: Iterable[Mapping[str, Any]]) -> None:
        keep = {
            k: v for k, v in self.entries.items() if namespace is not None and k[0] != namespace
        }
        for raw in items:
            entry = parse_entry(raw)
            if entry is not None:
                keep[(entry.pcd.metadata.namespace, entry.pcd.metadata.name)] = entry
        self.entries = keep
        self.version += 1

    def _event(self, type_: str, raw: Mapping[str, Any]) -> None:
        meta = raw.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        if type_ == "DELETED":
            self.entries.pop(key, None)
        else:
            entry = parse_entry(raw)
            if entry is None:
                self.entries.pop(key, None)
            else:
                self.entries[key] = entry
        self.version += 1

    def _apply(self, type_: str, raw: Mapping[str, Any]) -> str | None:
        """Take one watch event in; the resourceVersion it carries, if any."""
        if type_ != "BOOKMARK":
            self._event(type_, raw)
        version = (raw.get("metadata") or {}).get("resourceVersion")
        return str(version) if version else None

    async def run(self) -> None:
        """Keep every namespace's resources current until cancelled."""
        scopes: list[str | None] = list(self.namespaces) or [None]
        await asyncio.gather(*(self._follow(ns, len(scopes)) for ns in scopes))

    async def _follow(self, namespace: str | None, scopes: int) -> None:
        failures = 0
        version: str | None = None
        while True:
            try:
                if version is None:
                    items, version = await self.kube.list_versioned(RESOURCE, namespace)
                    self._replace(namespace, items)
                    self._listed.add(namespace)
                    if len(self._listed) == scopes:
                        self.synced.set()
                async for type_, raw in self.kube.watch(
                    RESOURCE, namespace, resource_version=version
                ):
                    version = self._apply(type_, raw) or version
                    failures = 0
                # The server ended the watch (its timeout): resume from the last version.
            except GoneError:
                version = None  # that version is compacted away: list again, at once
            except asyncio.CancelledError:
                raise
            except Exception as error:  # API refusals and transport errors alike
                wait = BACKOFF_S[min(failures, len(BACKOFF_S) - 1)]
                failures += 1
                log.warning(
                    "watching PromptCacheDeployments in %s: %s: %s; again in %.1f s",
                    namespace or "all namespaces",
                    type(error).__name__,
                    error,
                    wait,
                )
                await asyncio.sleep(wait)
