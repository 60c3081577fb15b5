"""The responder's informer loop, step by step against a scripted API client: what it
lists, where each watch resumes, and what a 410 or a broken stream makes it do. (The
same loop against the real API server: e2e/test_model_catalog.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from harness.resources import routed_resource
from promptcache.catalog.watch import ResourceCache
from promptcache.controller.errors import GoneError
from promptcache.controller.kube import Kind


def obj(name: str, version: str, **kw: Any) -> dict[str, Any]:
    doc = routed_resource(name, f"base-{name}", [], namespace="ns", **kw)
    doc["metadata"]["resourceVersion"] = version
    doc["metadata"]["creationTimestamp"] = "2026-12-04T10:00:00Z"
    return doc


class ScriptedKube:
    """Answers each list and watch from a script, and records where each watch started."""

    def __init__(self, lists: list[tuple[list[dict[str, Any]], str]],
                 watches: list[list[dict[str, Any]] | BaseException]) -> None:  # fmt: skip
        self.lists, self.watches = lists, watches
        self.watched_from: list[str] = []
        self.listed = 0
        self.done = asyncio.Event()

    async def list_versioned(self, kind: Kind, namespace: str | None) -> tuple[list[Any], str]:
        self.listed += 1
        return self.lists.pop(0)

    async def watch(
        self, kind: Kind, namespace: str | None, *, resource_version: str
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """As `Kube.watch`: (type, object) pairs."""
        self.watched_from.append(resource_version)
        if not self.watches:
            self.done.set()
            await asyncio.Event().wait()  # the last watch stays open
        step = self.watches.pop(0)
        if isinstance(step, BaseException):
            raise step
        for event in step:
            yield str(event["type"]), dict(event["object"])


async def run_until_done(kube: ScriptedKube) -> ResourceCache:
    cache = ResourceCache(kube, ("ns",))  # type: ignore[arg-type]
    task = asyncio.create_task(cache.run())
    await asyncio.wait_for(kube.done.wait(), 10)
    task.cancel()
    return cache


async def test_events_update_the_view_and_each_watch_resumes_where_the_last_ended() -> None:
    kube = ScriptedKube(
        lists=[([obj("a", "10")], "10")],
        watches=[
            [
                {"type": "ADDED", "object": obj("b", "11")},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}},
            ],
            [{"type": "DELETED", "object": obj("a", "16")}],
        ],
    )
    cache = await run_until_done(kube)
    assert kube.watched_from == ["10", "15", "16"]
    assert kube.listed == 1
    assert cache.synced.is_set()
    assert sorted(cache.entries) == [("ns", "b")]
    assert cache.created() == {"ns/b": 1796378400}


async def test_a_gone_version_lists_again_and_a_broken_stream_resumes() -> None:
    kube = ScriptedKube(
        lists=[([obj("a", "10")], "10"), ([obj("c", "30")], "30")],
        watches=[ConnectionResetError("reset"), GoneError(410, "Expired", "too old")],
    )
    cache = await run_until_done(kube)
    # the reset resumed from 10 (after a short back-off); the 410 listed again, at once
    assert kube.watched_from == ["10", "10", "30"]
    assert kube.listed == 2
    assert sorted(cache.entries) == [("ns", "c")]


async def test_a_resource_that_does_not_parse_is_left_out_and_a_bad_status_dropped() -> None:
    broken = obj("x", "12")
    broken["spec"]["model"]["replicas"] = "many"
    odd_status = obj("y", "13")
    odd_status["status"]["readyReplicas"] = "lots"
    kube = ScriptedKube(
        lists=[([obj("a", "10")], "10")],
        watches=[[{"type": "ADDED", "object": broken}, {"type": "ADDED", "object": odd_status}]],
    )
    cache = await run_until_done(kube)
    assert sorted(cache.entries) == [("ns", "a"), ("ns", "y")]
    assert cache.entries[("ns", "y")].pcd.status is None
