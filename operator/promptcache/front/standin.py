"""A stand-in for vLLM's HTTP surface, for tests and benchmarks of the front.

It sits exactly where vLLM sits (the system boundary): it speaks enough of the
OpenAI-compatible API (completions and chat, whole or streamed with a usage
chunk), serves vLLM-like `/metrics` and `/health`, and records every request it
receives byte for byte, so tests can assert what vLLM would have been sent.
It never runs a model: answers are fixed text, usage is what the test sets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

VLLM_METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="standin"}} {running}
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="standin"}} {waiting}
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="standin"}} {kv}
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",cache_dtype="auto",enable_prefix_caching="True",\
engine="0",num_gpu_blocks="4096"}} 1.0
"""


@dataclass
class Recorded:
    """One request as the stand-in received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class StandinUpstream:
    """State and knobs of one stand-in server; tests change the knobs between requests."""

    requests: list[Recorded] = field(default_factory=list)
    prompt_tokens: int = 42
    cached_tokens: int | None = 16
    chunks: int = 3
    chunk_delay: float = 0.0
    response_delay: float = 0.0
    healthy: bool = True
    fail_next: tuple[int, bytes] | None = None
    cancelled: int = 0
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.25
    started: asyncio.Event = field(default_factory=asyncio.Event)

    def usage(self) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.chunks,
            "total_tokens": self.prompt_tokens + self.chunks,
        }
        if self.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return usage

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(Recorded(request.method, request.path, dict(request.headers), body))
        self.started.set()
        try:
            if self.fail_next is not None:
                status, payload = self.fail_next
                self.fail_next = None
                return web.Response(status=status, body=payload, content_type="application/json")
            if self.response_delay:
                await asyncio.sleep(self.response_delay)
            req = json.loads(body)
            chat = request.path.endswith("/chat/completions")
            if req.get("stream"):
                return await self._stream(request, req, chat)
            choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
            if chat:
                choice["message"] = {"role": "assistant", "content": "ok " * self.chunks}
            else:
                choice["text"] = "ok " * self.chunks
            return web.json_response(
                {
                    "id": "cmpl-standin",
                    "object": "chat.completion" if chat else "text_completion",
                    "created": int(time.time()),
                    "model": req.get("model", "standin"),
                    "choices": [choice],
                    "usage": self.usage(),
                }
            )
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def _stream(
        self, request: web.Request, req: dict[str, Any], chat: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(self.chunks):
            delta: dict[str, Any] = (
                {"index": 0, "delta": {"content": f"tok{i} "}, "finish_reason": None}
                if chat
                else {"index": 0, "text": f"tok{i} ", "finish_reason": None}
            )
            chunk = {"id": "cmpl-standin", "object": "chunk", "choices": [delta]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if self.chunk_delay:
                await asyncio.sleep(self.chunk_delay)
        options = req.get("stream_options") or {}
        if options.get("include_usage"):
            final: dict[str, Any] = {
                "id": "cmpl-standin",
                "object": "chunk",
                "choices": [],
                "usage": self.usage(),
            }
            await response.write(f"data: {json.dumps(final)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _other(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.requests.append(Recorded(request.method, request.path, dict(request.headers), body))
        return web.json_response({"path": request.path, "echo": body.decode("utf-8", "replace")})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        text = VLLM_METRICS.format(running=self.running, waiting=self.waiting, kv=self.kv_usage)
        return web.Response(text=text, content_type="text/plain")

    def app(self) -> web.Application:
        """The aiohttp application serving this stand-in."""
        app = web.Application(client_max_size=1 << 30)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_route("*", "/{tail:.*}", self._other)
        return app


async def start_standin(
    standin: StandinUpstream, host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, str]:
    """Serve a stand-in on loopback; returns the runner (to clean up) and its base URL."""
    runner = web.AppRunner(standin.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, f"http://{host}:{bound}"


async def _serve_forever(port: int) -> None:
    standin = StandinUpstream(chunks=1)
    runner, url = await start_standin(standin, port=port)
    print(url, flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main() -> None:
    """`python -m promptcache.front.standin PORT`: a stand-in vLLM for benchmarks."""
    import sys  # noqa: PLC0415 - only the script entry point needs argv

    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_forever(port))


if __name__ == "__main__":
    main()
