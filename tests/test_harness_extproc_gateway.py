"""The test gateway's `exchange` against a server that ends the stream early, over real gRPC.

A step that refuses at the headers ends its stream while the gateway still sends the body.
gRPC's Python client then often reports INTERNAL ("Internal error from Core") instead of the
server's status, though it received the server's answer: with ten body messages behind the
headers, every one of 1,000 exchanges did before `exchange` handled it, and a CI run failed a
hostile-corpus case on the same race with one body message. These pin that the answer is
returned, and that a real error status is still raised.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from harness.extproc_gateway import Gateway, body_msg, headers_msg

BODY_MESSAGES = 10
"""Enough body messages behind the headers that writes are still going when the server ends
the stream: the race every exchange loses without the fix."""


class RefusesAtHeaders:
    """Answers the first message with a refusal and ends the stream, as the policy step
    does for a request whose headers it refuses."""

    async def Process(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        async for _ in requests:
            yield pb.ProcessingResponse(immediate_response=pb.ImmediateResponse(body=b"no"))
            return


class FailsAtHeaders:
    """Ends the stream with an error status and no answer."""

    async def Process(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        async for _ in requests:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "not you")
        yield pb.ProcessingResponse()  # never reached: makes this an async generator


async def serve(servicer: Any) -> tuple[grpc.aio.Server, Gateway]:
    server = grpc.aio.server()
    pb_grpc.add_ExternalProcessorServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, Gateway(f"127.0.0.1:{port}")


def request() -> list[Any]:
    chunks = [body_msg(b"x" * 1000, end_of_stream=False) for _ in range(BODY_MESSAGES)]
    return [headers_msg({}), *chunks]


async def test_a_stream_the_server_ends_early_returns_its_answer() -> None:
    server, gateway = await serve(RefusesAtHeaders())
    try:
        for _ in range(20):
            responses = await gateway.exchange(*request())
            assert [r.WhichOneof("response") for r in responses] == ["immediate_response"]
            assert responses[0].immediate_response.body == b"no"
    finally:
        await gateway.close()
        await server.stop(0)


async def test_an_error_status_is_still_raised() -> None:
    server, gateway = await serve(FailsAtHeaders())
    try:
        for _ in range(5):
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await gateway.exchange(*request())
            # The server's own status, or the client's INTERNAL when its write raced the
            # end: either way the stream failed with no answer, and the caller hears of it.
            assert raised.value.code() in (
                grpc.StatusCode.PERMISSION_DENIED,
                grpc.StatusCode.INTERNAL,
            )
    finally:
        await gateway.close()
        await server.stop(0)
