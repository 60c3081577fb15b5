"""Watch-fed caches of what the operator reads: its resources, their children and pods.

Why: a reconcile that GETs each child and LISTs the pods costs about 16 API requests,
so a resync of 2,000 resources every minute is a steady ~500 requests per second
against the API server (a polling storm that grows with the fleet). Informers, as
client-go's controllers have them, turn that into one LIST and one long-lived WATCH
per kind: the reconcile reads the cache, and an idle resync sends nothing at all.

Each `Informer` keeps one kind, label-selected on the server (children carry
`app.kubernetes.io/managed-by=promptcache`; model-server pods their selector labels),
in one or more namespaces. It LISTs, then WATCHes from the list's resourceVersion with
bookmarks; a watch the server ends is resumed from the last version seen, a 410 Gone
relists, and errors back off (a 429's Retry-After first). Objects are held as compact
JSON without `managedFields`, decoded on read: 2,000 resources' children and pods are
some 30,000 objects, which as Python dicts would cost several hundred MiB.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from promptcache.controller.errors import (
    ApiError,
    ApiUnreachableError,
    GoneError,
    NotFoundError,
    TooManyRequestsError,
)
from promptcache.controller.kube import Kind, Kube

log = logging.getLogger(__name__)

INDEX_LABEL = "app.kubernetes.io/instance"
"""Objects are also indexed by this label, so one resource's pods are found without a scan."""
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
"""Waits between failed list/watch attempts of one informer."""

SYNC_POLL_S = 1.0
"""How often a reader waiting for a first list looks whether the list was refused."""
SYNC_TIMEOUT_S = 60.0
"""A reader waits this long for a first list, then fails as if the API server were down
(the reconcile is retried): a stuck informer must not hold a reconcile slot for ever."""

Key = tuple[str, str]
"""(namespace, name)."""


def _encode(obj: Mapping[str, Any]) -> bytes:
    meta = dict(obj.get("metadata") or {})
    meta.pop("managedFields", None)
    return json.dumps({**obj, "metadata": meta}, separators=(",", ":")).encode()


def _key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


@dataclass
class _Entry:
    data: bytes
    labels: dict[str, str]
    version: str


@dataclass
class Informer:
    """One kind, kept current from a LIST and a WATCH per namespace (or cluster-wide)."""

    kube: Kube
    kind: Kind
    namespaces: tuple[str, ...] = ()
    """Empty: every namespace."""
    label_selector: str | None = None
    on_change: Callable[[str, Mapping[str, Any]], None] | None = None
    """Called with (event type, object) after the store took the change (not on relists)."""
    on_error: Callable[[str], None] | None = None
    """Called with a short reason on every failed list or watch (for a metric)."""
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once every namespace has been listed; reads before that would miss objects."""
    refused: ApiError | None = None
    """The last list's refusal that retrying cannot fix (403: RBAC), until a list succeeds."""
    _store: dict[Key, _Entry] = field(default_factory=dict)
    _index: dict[Key, set[str]] = field(default_factory=dict)
    _listed: set[str | None] = field(default_factory=set)

    # ------------------------------------------------------------------ reads

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        entry = self._store.get((namespace, name))
        return None if entry is None else dict(json.loads(entry.data))

    def version(self, namespace: str, name: str) -> str | None:
        """The stored object's resourceVersion (None: not there), without decoding it."""
        entry = self._store.get((namespace, name))
        return None if entry is None else entry.version

    def by_instance(self, namespace: str, instance: str) -> list[dict[str, Any]]:
        """Objects in `namespace` whose `app.kubernetes.io/instance` label is `instance`."""
        names = self._index.get((namespace, instance)) or set()
        return [dict(json.loads(self._store[(namespace, n)].data)) for n in sorted(names)]

    def items(self) -> Iterator[dict[str, Any]]:
        for entry in list(self._store.values()):
            yield dict(json.loads(entry.data))

    def __len__(self) -> int:
        return len(self._store)

    @property
    def stored_bytes(self) -> int:
        return sum(len(e.data) for e in self._store.values())

    # ------------------------------------------------------------------ writes

    def _put(self, obj: Mapping[str, Any]) -> None:
        key = _key(obj)
        self._unindex(key)
        labels = dict((obj.get("metadata") or {}).get("labels") or {})
        # A LIST of a built-in kind leaves apiVersion and kind out of its items; a cached
        # object must look like a GET's, which the containment check compares against.
        typed = {"apiVersion": self.kind.api_version, "kind": self.kind.kind, **obj}
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        self._store[key] = _Entry(_encode(typed), labels, version)
        instance = labels.get(INDEX_LABEL)
        if instance is not None:
            self._index.setdefault((key[0], instance), set()).add(key[1])

    def _drop(self, key: Key) -> None:
        self._unindex(key)
        self._store.pop(key, None)

    def _unindex(self, key: Key) -> None:
        old = self._store.get(key)
        instance = old.labels.get(INDEX_LABEL) if old is not None else None
        if instance is not None:
            names = self._index.get((key[0], instance))
            if names is not None:
                names.discard(key[1])
                if not names:
                    del self._index[(key[0], instance)]

    def observe(self, obj: Mapping[str, Any]) -> None:
        """Take an object the operator itself just created (its apply's answer) if the watch
        has not shown it yet, so the next read does not miss it; the watch then overwrites it.

        An object the store already holds is left alone: the watch may have delivered newer
        versions (the controller-manager's status updates) while the apply's answer was on
        its way, and writing the older answer over them would leave the cache stale until
        the object changes again (a Deployment reported not ready for ever). A version
        compare would need resourceVersions to be ordered, which the API does not promise."""
        if _key(obj) not in self._store:
            self._put(obj)

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Forever (until cancelled): one list-and-watch loop per namespace."""
        scopes: tuple[str | None, ...] = self.namespaces or (None,)
        await asyncio.gather(*(self._run_scope(ns) for ns in scopes))

    def _relisted(self, namespace: str | None, items: list[dict[str, Any]]) -> None:
        for item in items:
            self._put(item)
        self._listed_all(namespace, {_key(item) for item in items})

    def _listed_all(self, namespace: str | None, seen: set[Key]) -> None:
        """A list of `namespace` (None: all) is complete: drop what it no longer holds."""
        stale = [k for k in self._store if (namespace is None or k[0] == namespace)]
        for key in stale:
            if key not in seen:
                self._drop(key)
        self._listed.add(namespace)
        if len(self._listed) == len(self.namespaces or (None,)):
            self.synced.set()

    async def _run_scope(self, namespace: str | None) -> None:
        version = ""
        failures = 0
        while True:
            try:
                if not version:
                    version = await self._list(namespace)
                    self.refused = None
                version = await self._watch(namespace, version)
                failures = 0
            except GoneError:
                version = ""  # too old to resume: list again
            except (ApiError, OSError, ValueError) as error:
                wait = BACKOFF_S[min(failures, len(BACKOFF_S) - 1)]
                if isinstance(error, TooManyRequestsError) and error.retry_after_s:
                    wait = max(wait, error.retry_after_s)
                if isinstance(error, NotFoundError):
                    version = ""  # the kind is not served (yet): list again when it is
                if isinstance(error, ApiError) and not error.transient and not version:
                    self.refused = error
                failures += 1
                if self.on_error is not None:
                    self.on_error(type(error).__name__)
                if failures in (1, len(BACKOFF_S)):
                    log.warning("watching %s failed: %s (retrying)", self.kind.plural, error)
                await asyncio.sleep(wait)
            except Exception as error:  # the transport's own errors (httpx)
                failures += 1
                if self.on_error is not None:
                    self.on_error(type(error).__name__)
                log.debug("watch of %s interrupted: %r", self.kind.plural, error)
                await asyncio.sleep(BACKOFF_S[min(failures - 1, len(BACKOFF_S) - 1)])

    async def _list(self, namespace: str | None) -> str:
        """List page by page, storing each page as it comes (its objects are encoded at
        once); the list's resourceVersion."""
        seen: set[Key] = set()
        version = ""
        async for page, page_version in self.kube.list_pages(
            self.kind, namespace, label_selector=self.label_selector
        ):
            version = page_version
            for item in page:
                self._put(item)
                seen.add(_key(item))
        self._listed_all(namespace, seen)
        return version

    async def _watch(self, namespace: str | None, version: str) -> str:
        """Apply the events of one watch; the version to resume from when it ends."""
        async for type_, obj in self.kube.watch(
            self.kind, namespace, resource_version=version, label_selector=self.label_selector
        ):
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if type_ == "BOOKMARK":
                continue
            if type_ == "DELETED":
                self._drop(_key(obj))
            else:
                self._put(obj)
            if self.on_change is not None:
                self.on_change(type_, obj)
        return version


@dataclass
class Caches:
    """The informers of one operator: its resources, each child kind, the model-server pods.

    `start` starts the resources' informer; a child kind's is started the first time a
    reconcile reads it, so a kind the operator never renders (a Role when the picker's
    rights come from a ClusterRole, which the chart's RBAC would refuse to list) and an
    optional kind before discovery finds its CRD are never watched."""

    kube: Kube
    namespaces: tuple[str, ...]
    resource: Kind
    pod: Kind
    child_selector: str
    pod_selector: str
    on_child_change: Callable[[str, str, Mapping[str, Any]], None] | None = None
    """Called with (kind, event type, object) for every watched change of a child."""
    on_error: Callable[[str], None] | None = None
    _informers: dict[str, Informer] = field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def _start(self, kind: Kind, selector: str | None, *, child: bool) -> Informer:
        def changed(event: str, obj: Mapping[str, Any]) -> None:
            if self.on_child_change is not None:
                self.on_child_change(kind.kind, event, obj)

        informer = Informer(
            self.kube,
            kind,
            self.namespaces,
            selector,
            on_change=changed if child else None,
            on_error=self.on_error,
        )
        self._informers[kind.kind] = informer
        self._tasks.append(asyncio.create_task(informer.run(), name=f"informer-{kind.plural}"))
        return informer

    def start(self) -> None:
        self.informer(self.resource)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    def informer(self, kind: Kind) -> Informer:
        """The kind's informer, started now if it is an optional kind seen for the first time."""
        found = self._informers.get(kind.kind)
        if found is not None:
            return found
        if kind == self.resource:
            return self._start(kind, None, child=False)
        if kind == self.pod:
            return self._start(kind, self.pod_selector, child=False)
        return self._start(kind, self.child_selector, child=True)

    async def synced(self, kind: Kind) -> Informer:
        """The kind's informer once it has listed; its refusal (a 403) if it cannot list,
        so the reconcile reports it (`ApplyFailed`) instead of waiting forever."""
        informer = self.informer(kind)
        deadline = time.monotonic() + SYNC_TIMEOUT_S
        while not informer.synced.is_set():
            if informer.refused is not None:
                raise informer.refused
            if time.monotonic() > deadline:
                raise ApiUnreachableError(f"no list of {kind.plural} in {SYNC_TIMEOUT_S:g}s")
            try:
                await asyncio.wait_for(informer.synced.wait(), SYNC_POLL_S)
            except TimeoutError:
                continue
        return informer

    def sizes(self) -> dict[str, tuple[int, int]]:
        """(objects, bytes held) by kind: for the operator's metrics."""
        return {k: (len(i), i.stored_bytes) for k, i in self._informers.items()}
