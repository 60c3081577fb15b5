"""`promptcache catalog`: the model-list responder of shared Gateways.

Imported by the CLI to build its parser, so nothing heavy is imported until it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any

from promptcache.contract.pods import Command
from promptcache.contract.router import CATALOG_HEALTH_PORT, CATALOG_PORT

# ruff: noqa: PLC0415 - the CLI builds its parser from this module; aiohttp waits for `run`


def run(args: argparse.Namespace) -> int:
    from promptcache.catalog.serve import CatalogOptions, serve

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # One line per API request (every watch reconnect) is noise at info and below.
    for chatty in ("httpx2", "httpcore2"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    options = CatalogOptions(
        namespaces=() if args.all_namespaces else tuple(args.namespaces),
        bind_address=args.bind_address,
        port=args.port,
        health_port=args.health_port,
    )
    return asyncio.run(serve(options))


def register(sub: Any) -> None:
    parser = sub.add_parser(
        Command.CATALOG.value,
        help="answer GET /v1/models for Gateways shared by resources routing by model",
        description="The model-list responder: lists, per Gateway, every model and adapter "
        "that the PromptCacheDeployments routing by model serve on it (only what a ready "
        "pod serves), and answers a request for a model no resource serves with an "
        "OpenAI-shaped 404. It reads the resources (get, list, watch) and writes nothing. "
        "Deployed by the chart (bodyBasedRouter.modelList); docs/multi-model.md.",
    )
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "-n", "--namespace", action="append", dest="namespaces", metavar="NS",
        help="read the resources of this namespace (repeatable)",
    )  # fmt: skip
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="read every namespace's resources"
    )
    parser.add_argument("--bind-address", default="0.0.0.0", help="address of both ports")  # noqa: S104
    parser.add_argument(
        "--port", type=int, default=CATALOG_PORT,
        help=f"the port the Gateway routes to (default {CATALOG_PORT})",
    )  # fmt: skip
    parser.add_argument(
        "--health-port", type=int, default=CATALOG_HEALTH_PORT,
        help=f"/healthz and /readyz (default {CATALOG_HEALTH_PORT})",
    )  # fmt: skip
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    parser.set_defaults(func=run)
