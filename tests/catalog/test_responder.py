"""The model-list responder over real sockets: the list per Gateway and Host, the errors a
Gateway's unrouted requests get, and the boundary (methods, bodies, headers, HTTP framing)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from harness.resources import routed_resource
from promptcache.api import PromptCacheDeployment, parse_resource
from promptcache.catalog.app import SERVER_OPTIONS, Catalog, CatalogServer
from promptcache.contract.router import GATEWAY_HEADER, MODEL_HEADER

GW = {GATEWAY_HEADER: "gw/shared"}


def pcd(name: str, served: str, adapters: list[str], **kw: Any) -> PromptCacheDeployment:
    return parse_resource(routed_resource(name, served, adapters, **kw))


@dataclass
class World:
    """What the responder reads: the resources, as a watch would hand them over."""

    resources: list[PromptCacheDeployment] = field(default_factory=list)
    version: int = 0
    ready: bool = True

    def catalog(self) -> Catalog:
        return Catalog(
            resources=lambda: self.resources,
            created=lambda: {"team/a": 1700000000},
            version=lambda: self.version,
            ready=lambda: self.ready,
        )


@pytest.fixture
def world() -> World:
    return World(
        [
            pcd("a", "base-a", ["a-sql", "a-chat"], ready_adapters=["a-sql"]),
            pcd("b", "org/base-b", []),
            pcd("c", "base-c", [], ready=0),
            pcd("h", "base-h", [], hostnames=["h.example"]),
        ]
    )


@pytest.fixture
async def url(world: World) -> AsyncIterator[str]:
    runner = web.ServerRunner(CatalogServer(world.catalog(), **SERVER_OPTIONS))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    yield f"http://{host}:{port}"
    await runner.cleanup()


async def call(
    url: str, method: str, path: str, headers: dict[str, str] | None = None, **kw: Any
) -> tuple[int, dict[str, str], Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, url + path, headers=headers, **kw) as resp,
    ):
        text = await resp.text()
        return resp.status, dict(resp.headers), json.loads(text) if text else None


def error_of(body: Any) -> tuple[str, str | None, int]:
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    return err["type"], err["param"], err["code"]


async def test_lists_what_ready_pods_serve_on_that_gateway_and_host(url: str) -> None:
    status, headers, body = await call(url, "GET", "/v1/models", GW)
    assert status == 200
    assert headers["Content-Type"].startswith("application/json")
    assert [m["id"] for m in body["data"]] == ["a-sql", "base-a", "org/base-b"]
    assert body["data"][1] == {
        "id": "base-a", "object": "model", "owned_by": "team/a", "created": 1700000000,
    }  # fmt: skip
    _, _, hosted = await call(url, "GET", "/v1/models", {**GW, "Host": "H.Example:8443"})
    assert [m["id"] for m in hosted["data"]] == ["a-sql", "base-a", "base-h", "org/base-b"]
    _, _, other = await call(url, "GET", "/v1/models", {GATEWAY_HEADER: "gw/other"})
    assert other == {"object": "list", "data": []}
    status, _, head = await call(url, "HEAD", "/v1/models", GW)
    assert status == 200
    assert head is None


async def test_the_list_follows_the_resources(url: str, world: World) -> None:
    _, _, before = await call(url, "GET", "/v1/models", GW)
    world.resources = [pcd("a", "base-a", ["a-sql", "a-chat"])]
    world.version += 1
    _, _, after = await call(url, "GET", "/v1/models", GW)
    assert len(before["data"]) == 3
    assert [m["id"] for m in after["data"]] == ["a-chat", "a-sql", "base-a"]


async def test_retrieve_one_model_by_id_even_with_a_slash(url: str) -> None:
    status, _, body = await call(url, "GET", "/v1/models/org%2Fbase-b", GW)
    assert status == 200
    assert body["id"] == "org/base-b"
    status, _, body = await call(url, "GET", "/v1/models/org/base-b", GW)
    assert status == 200
    assert body["id"] == "org/base-b"
    status, _, body = await call(url, "GET", "/v1/models/a-chat", GW)
    assert status == 404
    assert error_of(body) == ("NotFoundError", "model", 404)
    assert body["error"]["message"] == (
        "The model `a-chat` does not exist. Valid aliases: base-a, org/base-b."
    )


async def test_an_unknown_model_gets_vllms_not_found(url: str) -> None:
    status, _, body = await call(
        url, "POST", "/v1/chat/completions", {**GW, MODEL_HEADER: "gpt-9"},
        json={"model": "gpt-9", "messages": []},
    )  # fmt: skip
    assert status == 404
    assert body == {
        "error": {"message": "The model `gpt-9` does not exist. Valid aliases: base-a, org/base-b.", "type": "NotFoundError",
                  "param": "model", "code": 404}
    }  # fmt: skip


async def test_a_declared_model_that_is_not_ready_is_starting_not_missing(url: str) -> None:
    for name in ("base-c", "a-chat"):
        status, headers, body = await call(
            url, "POST", "/v1/completions", {**GW, MODEL_HEADER: name}, data=b"{}"
        )
        assert status == 503, name
        assert error_of(body) == ("ServiceUnavailableError", "model", 503)
        assert f"`{name}` is not ready yet" in body["error"]["message"]
        assert headers["Retry-After"] == "5"


async def test_a_request_without_model_or_route_is_told_why(url: str) -> None:
    status, _, body = await call(url, "POST", "/v1/chat/completions", GW, data=b"{}")
    assert status == 400
    assert error_of(body) == ("BadRequestError", "model", 400)
    assert "names no model" in body["error"]["message"]
    status, _, body = await call(url, "GET", "/metrics", GW)
    assert status == 404
    assert error_of(body) == ("NotFoundError", None, 404)
    assert body["error"]["message"] == "No route for GET /metrics on this Gateway."


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {GATEWAY_HEADER: "shared"},
        {GATEWAY_HEADER: "GW/Shared"},
        {GATEWAY_HEADER: "gw/shared/https/extra"},
        {GATEWAY_HEADER: "gw/" + "x" * 300},
        {GATEWAY_HEADER: "gw/sh ared"},
    ],
)
async def test_without_a_valid_gateway_header_nothing_is_looked_up(
    url: str, headers: dict[str, str]
) -> None:
    status, _, body = await call(url, "GET", "/v1/models", headers)
    assert status == 400
    assert error_of(body) == ("BadRequestError", GATEWAY_HEADER, 400)


async def test_two_gateway_headers_are_refused(url: str) -> None:
    reader, writer = await _open(url)
    writer.write(
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
        + f"{GATEWAY_HEADER}: gw/shared\r\n{GATEWAY_HEADER}: gw/other\r\n\r\n".encode()
    )
    status, body = await _read(reader)
    writer.close()
    assert status == 400
    assert error_of(body)[1] == GATEWAY_HEADER


async def test_models_takes_get_only_and_no_body(url: str) -> None:
    status, headers, body = await call(url, "POST", "/v1/models", GW, data=b"{}")
    assert status == 405
    assert headers["Allow"] == "GET, HEAD"
    assert error_of(body) == ("MethodNotAllowed", None, 405)
    status, headers, body = await call(url, "GET", "/v1/models", GW, data=b'{"a": 1}')
    assert status == 400
    assert "takes no body" in body["error"]["message"]
    assert headers.get("Connection") == "close"


async def test_not_ready_until_the_first_list(url: str, world: World) -> None:
    world.ready = False
    status, headers, body = await call(url, "GET", "/v1/models", GW)
    assert status == 503
    assert headers["Retry-After"] == "1"
    assert error_of(body) == ("ServiceUnavailableError", None, 503)


async def _open(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def _read(reader: asyncio.StreamReader) -> tuple[int, Any]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    status = int(head.split(b" ", 2)[1])
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return status, json.loads(await reader.readexactly(length))


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n", 431),
        (b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 200 + b"\r\n", 431),
        (b"G(T /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            400,
        ),
        (b"GET /v1/models HTTP/1.1\r\nHo st: x\r\n\r\n", 400),
    ],
)
async def test_what_the_http_parser_refuses_is_a_json_error(
    url: str, raw: bytes, status: int
) -> None:
    reader, writer = await _open(url)
    writer.write(raw)
    got, body = await _read(reader)
    writer.close()
    assert got == status
    assert error_of(body)[2] == status


async def test_an_unread_large_body_is_not_drained(url: str) -> None:
    """A 64 MiB upload for an unknown model gets its 404 at once and the connection closes:
    the responder never reads it."""
    reader, writer = await _open(url)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
        + f"{GATEWAY_HEADER}: gw/shared\r\n{MODEL_HEADER}: nope\r\n".encode()
        + f"Content-Length: {64 << 20}\r\n\r\n".encode()
        + b"{"
    )
    status, body = await _read(reader)
    assert status == 404
    assert body["error"]["type"] == "NotFoundError"
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the responder
    writer.close()


async def test_an_unknown_models_aliases_are_bounded(world: World) -> None:
    world.resources = [pcd(f"r{i}", f"base-{i:02d}", []) for i in range(40)]
    runner = web.ServerRunner(CatalogServer(world.catalog(), **SERVER_OPTIONS))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        status, _, body = await call(
            f"http://{host}:{port}", "POST", "/v1/completions", {**GW, MODEL_HEADER: "x"}
        )
    finally:
        await runner.cleanup()
    assert status == 404
    message = body["error"]["message"]
    assert message.endswith(".")
    aliases = message[:-1].split("Valid aliases: ", 1)[1].split(", ")
    assert aliases == [f"base-{i:02d}" for i in range(32)] + ["..."]
