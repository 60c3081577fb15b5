"""The informer store and the client's handling of 429s.

The store: whatever sequence of watch events and relists arrives, it holds exactly the
last state of every object, its instance index agrees with it, and objects read back as
a GET would show them (apiVersion and kind present, managedFields gone). A list call
per reconcile was what made the operator's steady-state traffic grow with the fleet;
these reads replace it.

The throttle: over a real socket, an API server answering 429 with Retry-After is
waited out (for at least the time it asked) and the request then succeeds; one that
never stops throttling gives the caller the typed error after a bounded number of tries.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from lightkube.config.kubeconfig import KubeConfig

from promptcache.controller.cache import INDEX_LABEL, Informer
from promptcache.controller.errors import TooManyRequestsError
from promptcache.controller.kube import THROTTLE_RETRIES, Kube, by_kind

POD = by_kind("Pod")


def _config(url: str) -> Any:
    """A kubeconfig for a plain-HTTP server (lightkube wants a user; a token will do)."""
    return KubeConfig.from_dict({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
    }).get()  # fmt: skip


def _pod(ns: str, name: str, instance: str, version: int) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": ns,
            "name": name,
            "labels": {INDEX_LABEL: instance},
            "resourceVersion": str(version),
            "managedFields": [{"manager": "kubelet"}],
        },
        "status": {"phase": "Running"},
    }


_ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "drop", "relist"]),
        st.sampled_from(["a", "b"]),
        st.sampled_from(["p1", "p2", "p3"]),
        st.sampled_from(["i1", "i2"]),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(_ops)
def test_the_store_holds_the_last_state_and_its_index_agrees(ops: list[Any]) -> None:
    informer = Informer(kube=None, kind=POD, namespaces=("a", "b"))  # type: ignore[arg-type]
    model: dict[tuple[str, str], dict[str, Any]] = {}
    for version, (op, ns, name, instance) in enumerate(ops):
        pod = _pod(ns, name, instance, version)
        if op == "put":
            informer._put(pod)
            model[(ns, name)] = pod
        elif op == "drop":
            informer._drop((ns, name))
            model.pop((ns, name), None)
        else:  # namespace `ns` relisted: it now holds only this pod
            informer._relisted(ns, [pod])
            model = {k: v for k, v in model.items() if k[0] != ns}
            model[(ns, name)] = pod
    assert len(informer) == len(model)
    for (ns, name), pod in model.items():
        got = informer.get(ns, name)
        assert got is not None
        assert got["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]
        assert (got["apiVersion"], got["kind"]) == ("v1", "Pod")  # as a GET shows it
        assert "managedFields" not in got["metadata"]
    for ns in ("a", "b"):
        for instance in ("i1", "i2"):
            want = sorted(
                name
                for (n, name), pod in model.items()
                if n == ns and pod["metadata"]["labels"][INDEX_LABEL] == instance
            )
            got_names = [p["metadata"]["name"] for p in informer.by_instance(ns, instance)]
            assert got_names == want


def test_an_apply_answer_never_overwrites_what_the_watch_delivered() -> None:
    """The watch showed the controller-manager's status update before the apply's (older)
    answer came back: the cache keeps the watched version."""
    informer = Informer(kube=None, kind=POD, namespaces=("a",))  # type: ignore[arg-type]
    informer._put(_pod("a", "p", "i", 7))  # from the watch
    informer.observe(_pod("a", "p", "i", 5))  # the apply's answer, older
    assert informer.version("a", "p") == "7"
    informer.observe(_pod("a", "q", "i", 3))  # created, not yet watched: taken
    assert informer.version("a", "q") == "3"


def test_a_relist_of_every_namespace_marks_the_informer_synced() -> None:
    informer = Informer(kube=None, kind=POD, namespaces=("a", "b"))  # type: ignore[arg-type]
    informer._relisted("a", [])
    assert not informer.synced.is_set()
    informer._relisted("b", [_pod("b", "p", "i", 1)])
    assert informer.synced.is_set()


async def _server(answers: list[tuple[int, str | None]]) -> tuple[web.AppRunner, str, list[float]]:
    """An HTTP server that answers GET /api/v1/namespaces/ns/pods/p from `answers` in turn
    (status, Retry-After), then 200; it records when each request arrived."""
    seen: list[float] = []

    async def handle(_: web.Request) -> web.Response:
        seen.append(time.monotonic())
        if answers:
            status, retry_after = answers.pop(0)
            headers = {"Retry-After": retry_after} if retry_after is not None else {}
            return web.json_response(
                {"kind": "Status", "code": status, "reason": "TooManyRequests",
                 "message": "too many requests"},
                status=status, headers=headers,
            )  # fmt: skip
        return web.json_response({"kind": "Pod", "metadata": {"name": "p"}})

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ns/pods/p", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}", seen


async def test_a_429_is_waited_out_for_its_retry_after() -> None:
    runner, url, seen = await _server([(429, "1"), (429, None)])
    waits: list[float] = []
    kube = Kube(_config(url), on_throttle=waits.append)
    try:
        got = await kube.get(POD, "ns", "p")
    finally:
        await kube.close()
        await runner.cleanup()
    assert got == {"kind": "Pod", "metadata": {"name": "p"}}
    assert len(seen) == 3
    assert waits == [1.0, 1.0]  # the server's Retry-After, then the default for none
    assert seen[1] - seen[0] >= 1.0  # never sooner than asked


async def test_endless_throttling_ends_in_the_typed_error() -> None:
    runner, url, seen = await _server([(429, "0")] * (THROTTLE_RETRIES + 5))
    kube = Kube(_config(url))
    try:
        error = None
        try:
            await kube.get(POD, "ns", "p")
        except TooManyRequestsError as raised:
            error = raised
    finally:
        await kube.close()
        await runner.cleanup()
    assert error is not None
    assert error.retry_after_s == 0.0
    assert len(seen) == THROTTLE_RETRIES + 1


async def test_the_waits_of_concurrent_requests_are_spread() -> None:
    """Jitter: 16 callers throttled at once do not all come back in the same instant.

    The waits are read where they are decided (the client's sleep), not from when the
    retries reached the server: on a starved machine this test's event loop, which runs
    both, can stall past every timer and then send all 16 retries in one burst, jitter or
    not (it did in CI run ci-52, 0.55 ms apart)."""
    runner, url, seen = await _server([(429, "1")] * 16)
    waits: list[float] = []

    async def recorded(seconds: float) -> None:
        waits.append(seconds)
        await asyncio.sleep(seconds)

    kube = Kube(_config(url), sleep=recorded)
    try:
        await asyncio.gather(*(kube.get(POD, "ns", "p") for _ in range(16)))
    finally:
        await kube.close()
        await runner.cleanup()
    assert len(seen) == 32  # each caller throttled once, then served
    assert len(waits) == 16
    assert all(1.0 <= w <= 1.25 for w in waits), waits  # at least what Retry-After asked
    assert max(waits) - min(waits) > 0.01, waits
