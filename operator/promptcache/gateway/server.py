"""Running the policy step: bind the listening port, relay to the picker, drain on a stop
signal (`start`, `serve`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
import grpc.aio
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from prometheus_client import start_http_server

from promptcache.contract import (
    needs_salt_key,
)
from promptcache.contract.settings import split_host_port
from promptcache.gateway.policy_step import GatewayPolicyServicer
from promptcache.gateway.settings import GatewayPolicySettings
from promptcache.stopping import STOP_SIGNALS, stop_event

log = logging.getLogger("promptcache.gateway_policy")


@dataclass
class RunningGatewayPolicy:
    """A started policy step: where it listens, and how to stop it."""

    server: grpc.aio.Server
    channel: grpc.aio.Channel
    servicer: GatewayPolicyServicer
    port: int

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self, grace_s: float | None = None) -> None:
        """Refuse new streams, let open ones finish for `grace_s`, then close."""
        grace = self.servicer.settings.drain_seconds if grace_s is None else grace_s
        await self.server.stop(grace)
        await self.channel.close()
        self.servicer.close()


async def start(
    settings: GatewayPolicySettings, secret: bytes | None = None, *, reuse_port: bool = False
) -> RunningGatewayPolicy:
    """Bind `settings.listen` (port 0 picks a free one) and relay to `settings.upstream`.

    `secret`: the salt HMAC key (`tenancy.settings.read_salt_key`), needed by salting modes.
    `reuse_port`: one of `settings.workers` processes sharing the port (`gateway.workers`,
    which also keeps a second step off it)."""
    if secret is None and needs_salt_key(settings.isolation_mode):
        raise ValueError(f"isolation mode {settings.isolation_mode.value} needs the salt key")
    # Plain gRPC: the picker is on the pod's loopback (docs/endpoint-picker.md, 'Transport').
    channel = grpc.aio.insecure_channel(settings.upstream)
    servicer = GatewayPolicyServicer(settings, channel, secret)
    # No SO_REUSEPORT unless the step's own workers share the port: a second policy step on
    # the port must fail, not take half the streams.
    server = grpc.aio.server(options=[("grpc.so_reuseport", int(reuse_port))])
    pb_grpc.add_ExternalProcessorServicer_to_server(servicer, server)
    try:
        port = server.add_insecure_port(settings.listen)
    except RuntimeError:
        port = 0
    if port == 0:
        await channel.close()
        raise OSError(f"cannot listen on {settings.listen}")
    await server.start()
    return RunningGatewayPolicy(server, channel, servicer, port)


async def _serve(
    settings: GatewayPolicySettings, secret: bytes | None, signals: Sequence[signal.Signals]
) -> None:
    running = await start(settings, secret)
    if settings.metrics_listen:
        host, port = split_host_port("--metrics-listen", settings.metrics_listen)
        start_http_server(port, addr=host, registry=running.servicer.metrics.registry)
    log.info(
        "gateway policy step listening on %s (port %d), relaying ext_proc to the Endpoint "
        "Picker at %s; isolation %s (header %r, field %r); session header %r from "
        "prompt_cache_key or body field %r when absent; bodies up to %d bytes (%d bytes for "
        "all requests)",
        settings.listen, running.port, settings.upstream, settings.isolation_mode.value,
        settings.isolation_header, settings.isolation_field, settings.session_header,
        settings.user_field, settings.max_body_bytes, settings.max_buffered_bytes,
    )  # fmt: skip
    stopping = stop_event(signals)
    try:
        await stopping.wait()
    finally:
        log.info(
            "gateway policy step stopping: draining open streams for %ss", settings.drain_seconds
        )
        await running.stop()
        log.info("gateway policy step stopped")


def serve(settings: GatewayPolicySettings, secret: bytes | None = None) -> int:
    """Run until SIGTERM or SIGINT, then drain; the `gateway-policy` sub-command's body."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        asyncio.run(_serve(settings, secret, STOP_SIGNALS))
    except OSError as error:
        log.error("gateway policy step cannot start: %s", error)
        return 1
    return 0
