"""`promptcache run` (the operator) and `promptcache rbac` (its ClusterRole).

Imported by the CLI to build its parser, so this module imports nothing heavy:
kopf, aiohttp and the client load only when `run` runs. Configuration is read
when the command runs, never at import.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from typing import Any

from promptcache.api.defaults import add_default_flags, defaults_from_args
from promptcache.contract import Command
from promptcache.controller.options import (
    DEFAULT_BIND_ADDRESS,
    DEFAULT_HEALTH_PORT,
    DEFAULT_LEASE_NAME,
    DEFAULT_LEASE_NAMESPACE,
    DEFAULT_LEASE_SECONDS,
    DEFAULT_METRICS_PORT,
    DEFAULT_RESYNC_SECONDS,
    DEFAULT_SCRAPE_PORT,
    DEFAULT_SCRAPE_TIMEOUT_SECONDS,
    DEFAULT_STATUS_WINDOW_SECONDS,
    OperatorOptions,
)

# ruff: noqa: PLC0415 - the CLI builds its parser from this module; heavy imports wait for `run`


def register(sub: Any) -> None:
    run = sub.add_parser(
        Command.RUN.value, help="run the operator (reconcile PromptCacheDeployments)"
    )
    scope = run.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        dest="namespaces",
        metavar="NS",
        help="watch this namespace (repeatable)",
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    run.add_argument(
        "--bind-address",
        default=DEFAULT_BIND_ADDRESS,
        help="address of the health and metrics servers",
    )
    run.add_argument(
        "--health-port",
        type=int,
        default=DEFAULT_HEALTH_PORT,
        help=f"/healthz and /readyz (0: any free port; default {DEFAULT_HEALTH_PORT})",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        default=DEFAULT_METRICS_PORT,
        help=f"/metrics (0: any free port; default {DEFAULT_METRICS_PORT})",
    )
    run.add_argument(
        "--log-level",
        default=os.environ.get("PROMPTCACHE_LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
    )
    run.add_argument(
        "--resync-seconds",
        type=float,
        default=DEFAULT_RESYNC_SECONDS,
        help=f"period of the drift/status resync per resource (default {DEFAULT_RESYNC_SECONDS:g})",
    )
    run.add_argument(
        "--scrape-port",
        type=int,
        default=DEFAULT_SCRAPE_PORT,
        help=f"model-server metrics port (default {DEFAULT_SCRAPE_PORT})",
    )
    run.add_argument(
        "--scrape-timeout",
        type=float,
        default=DEFAULT_SCRAPE_TIMEOUT_SECONDS,
        help=f"seconds per pod scrape (default {DEFAULT_SCRAPE_TIMEOUT_SECONDS:g})",
    )
    run.add_argument(
        "--status-window-seconds",
        type=float,
        default=DEFAULT_STATUS_WINDOW_SECONDS,
        help="window of the status' recent hit ratio and hit-ratio ladder (default "
        f"{DEFAULT_STATUS_WINDOW_SECONDS:g})",
    )
    run.add_argument("--no-events", action="store_true", help="do not post Kubernetes Events")
    run.add_argument(
        "--no-leader-election",
        dest="leader_election",
        action="store_false",
        help="act without holding the Lease (a single replica, or development)",
    )
    run.add_argument(
        "--lease-namespace",
        default=None,
        help=f"namespace of the leader Lease (default: $POD_NAMESPACE, else "
        f"{DEFAULT_LEASE_NAMESPACE})",
    )
    run.add_argument("--lease-name", default=DEFAULT_LEASE_NAME)
    run.add_argument("--lease-seconds", type=int, default=DEFAULT_LEASE_SECONDS)
    run.add_argument("--identity", default=None, help="this replica's name in the Lease")
    add_default_flags(run)
    run.set_defaults(func=cmd_run)

    rbac = sub.add_parser(
        "rbac",
        help="print the operator's ClusterRole, its leader-election Role and the Endpoint "
        "Picker's ClusterRole (from the chart's rules files)",
    )
    rbac.add_argument("--name", default="promptcache-operator")
    rbac.set_defaults(func=cmd_rbac)


def cmd_rbac(args: argparse.Namespace) -> int:
    from promptcache.controller.rbac import cluster_role, leader_election_role, picker_cluster_role
    from promptcache.yamlio import dump_all

    roles = [
        cluster_role(args.name),
        leader_election_role(args.name),
        picker_cluster_role(args.name),
    ]
    sys.stdout.write(dump_all(roles))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    import asyncio
    import faulthandler
    import signal

    from promptcache.controller.main import serve

    try:
        defaults = defaults_from_args(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not args.status_window_seconds > 0:
        print("error: --status-window-seconds must be above 0", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # One line per HTTP request is noise at INFO; the operator's metrics count requests.
    logging.getLogger("httpx2").setLevel(max(logging.WARNING, getattr(logging, args.log_level)))
    # kopf logs every handler call per object at INFO (a line per Deployment event); the
    # operator logs what it does (children applied, problems) itself.
    logging.getLogger("kopf.objects").setLevel(
        max(logging.WARNING, getattr(logging, args.log_level))
    )
    # `kill -USR1 <pid>` dumps every thread's stack to stderr: for a stuck operator in the field.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    options = OperatorOptions(
        namespaces=tuple(args.namespaces or ()),
        all_namespaces=bool(args.all_namespaces),
        bind_address=args.bind_address,
        health_port=args.health_port,
        metrics_port=args.metrics_port,
        resync_s=args.resync_seconds,
        scrape_port=args.scrape_port,
        scrape_timeout_s=args.scrape_timeout,
        status_window_s=args.status_window_seconds,
        events=not args.no_events,
        leader_election=args.leader_election,
        lease_namespace=args.lease_namespace
        or os.environ.get("POD_NAMESPACE")
        or DEFAULT_LEASE_NAMESPACE,
        lease_name=args.lease_name,
        lease_s=args.lease_seconds,
        identity=args.identity
        or os.environ.get("POD_NAME")
        or f"{socket.gethostname()}-{os.getpid()}",
        defaults=defaults,
    )
    return asyncio.run(serve(options))
