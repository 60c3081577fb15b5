"""Both data-plane processes in a row, over real sockets: the gateway's policy step (real
gRPC, before a recording stand-in picker) and a cache front (real HTTP, before the vLLM
stand-in), with Envoy's part between them played by `harness.extproc_gateway`: the
client's headers, the picker's answers applied as Envoy's ext_proc filter applies them,
and the body the step forwarded. A request may also skip the gateway and reach the pod
directly, as a client inside the cluster can when NetworkPolicy is not enforced.

Used by tests/identity (its conftest starts planes with `start_plane`)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from harness.extproc_gateway import (
    Gateway,
    Upstream,
    body_msg,
    envoy_applies,
    forwarded_body,
    request_msg,
    start_upstream,
)
from harness.identity_corpus import SECRET, USER
from harness.standin import StandinUpstream, start_standin
from promptcache.contract import IsolationMode
from promptcache.embeds.cache import PromptEmbedsCache
from promptcache.front.http_server import create_runner
from promptcache.front.settings import FrontSettings
from promptcache.gateway.server import RunningGatewayPolicy, start
from promptcache.gateway.settings import GatewayPolicySettings

CHAT = "/v1/chat/completions"


@dataclass
class Answer:
    """What one request came to: refused (where, with what) or served (with which salt)."""

    status: int
    body: dict[str, Any]
    at: str
    """`gateway` (the step answered) or `front`."""
    salt: str | None = None
    """The `cache_salt` vLLM received (None: none, or not served)."""
    pod_headers: list[tuple[str, str]] = field(default_factory=list)
    """What the gateway sent the pod (empty when it refused)."""
    forwarded: bytes = b""


@dataclass
class Plane:
    """The step, the front and the stand-ins, for one isolation configuration."""

    step: RunningGatewayPolicy
    picker: Upstream
    front_url: str
    vllm: StandinUpstream
    http: aiohttp.ClientSession
    gateway: Gateway

    async def direct(self, headers: list[tuple[str, str]], body: bytes, path: str = CHAT) -> Answer:
        """POST to the pod's front, skipping the gateway."""
        served = len(self.vllm.requests)
        sent = CIMultiDict([("content-type", "application/json"), *headers])
        async with self.http.post(self.front_url + path, data=body, headers=sent) as resp:
            answer = Answer(resp.status, json.loads(await resp.read() or b"{}"), "front")
        if len(self.vllm.requests) > served:
            answer.salt = self.vllm.requests[-1].json().get("cache_salt")
        return answer

    async def through(self, headers: list[tuple[str, str]], body: dict[str, Any]) -> Answer:
        """The gateway's path: the step and picker decide, Envoy applies, the pod serves."""
        raw = json.dumps(body).encode()
        responses = await self.gateway.exchange(request_msg(headers), body_msg(raw))
        for r in responses:
            if r.WhichOneof("response") == "immediate_response":
                immediate = r.immediate_response
                return Answer(immediate.status.code, json.loads(immediate.body), "gateway")
        forwarded = forwarded_body(self.picker.fake.streams[-1])
        pod = envoy_applies(headers, responses)
        answer = await self.direct(pod, forwarded)
        answer.pod_headers, answer.forwarded = pod, forwarded
        return answer


MakePlane = Callable[..., Awaitable[Plane]]
Cleanups = list[Callable[[], Awaitable[Any]]]


async def start_plane(cleanups: Cleanups, **isolation: Any) -> Plane:
    """Start the stand-in vLLM, a front, the stand-in picker and the policy step, all with
    `isolation` (isolation by account on by default); what to stop goes into `cleanups`."""
    settings = {"isolation_mode": IsolationMode.PER_KEY, "identity_header": USER,
                "identity_bearer": True, **isolation}  # fmt: skip
    vllm = StandinUpstream()
    vllm_runner, vllm_url = await start_standin(vllm)
    cleanups.append(vllm_runner.cleanup)
    front = create_runner(
        FrontSettings(upstream=vllm_url, **settings), secret=SECRET,
        cache=PromptEmbedsCache(1 << 20),
    )  # fmt: skip
    await front.setup()
    site = web.TCPSite(front, "127.0.0.1", 0)
    await site.start()
    cleanups.append(front.cleanup)
    picker = await start_upstream()
    cleanups.append(lambda: picker.server.stop(0))
    step = await start(
        GatewayPolicySettings(listen="127.0.0.1:0", upstream=picker.target, **settings),
        SECRET,
    )
    cleanups.append(lambda: step.stop(grace_s=0))
    http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
    cleanups.append(http.close)
    gateway = Gateway(step.target)
    cleanups.append(gateway.close)
    front_url = f"http://127.0.0.1:{front.addresses[0][1]}"
    return Plane(step, picker, front_url, vllm, http, gateway)
