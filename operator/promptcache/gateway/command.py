"""`promptcache gateway-policy`: flags and environment variables into `GatewayPolicySettings`.

Every setting has a flag and an environment variable (`contract.GatewayPolicyEnv`, set by
the renderer on the EPP pod's `gateway-policy` container); the flag wins. This module
imports no gRPC: the CLI lists the sub-command in every install, and only running it
needs the `gateway` extra (`pip install 'promptcache[gateway]'`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from promptcache.contract.gateway_policy import GATEWAY_POLICY_SETTINGS
from promptcache.contract.pods import Command
from promptcache.contract.settings import SettingsError, add_flags, collect
from promptcache.gateway.settings import GatewayPolicySettings
from promptcache.tenancy.settings import read_salt_key

EXIT_BAD_SETTINGS = 2
EXIT_MISSING_EXTRA = 3
COMMAND = Command.GATEWAY_POLICY.value
"""The sub-command the rendered policy-step container runs (`contract.Command`)."""


def settings_from(args: argparse.Namespace, environ: Mapping[str, str]) -> GatewayPolicySettings:
    """Flags over environment over built-in defaults, validated."""
    return GatewayPolicySettings(**collect(GATEWAY_POLICY_SETTINGS, args, environ))


def run(args: argparse.Namespace) -> int:
    """The `gateway-policy` sub-command's body."""
    try:
        settings = settings_from(args, os.environ)
        secret = read_salt_key(settings.policy())
    except SettingsError as error:
        print(f"promptcache {COMMAND}: {error}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    try:
        # gRPC only when the step really runs: `promptcache` works without the extra.
        from promptcache.gateway.server import serve  # noqa: PLC0415
        from promptcache.gateway.workers import serve_workers  # noqa: PLC0415
    except ModuleNotFoundError as error:
        print(
            f"promptcache {COMMAND}: needs {error.name!r}; install the gateway extra: "
            "pip install 'promptcache[gateway]'",
            file=sys.stderr,
        )
        return EXIT_MISSING_EXTRA
    return serve_workers(settings, secret) if settings.workers > 1 else serve(settings, secret)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `gateway-policy` sub-command to the `promptcache` CLI."""
    parser = subparsers.add_parser(
        COMMAND,
        help="run the gateway's policy step in the Endpoint Picker pod (tenant salt, "
        "sessions, Required isolation) before the picker routes",
        description="An ext_proc proxy in front of the Endpoint Picker. It derives the "
        "tenant's cache_salt from the isolation key exactly as the cache front does (same "
        "HMAC, same secret, same modes) and puts it in the body the picker hashes, drops any "
        "salt the client sent, refuses a keyless request in Required mode with the front's "
        "error, and names the session from prompt_cache_key or `user` when the session "
        "header is absent. Every flag can also be set by its environment variable; the flag "
        "wins.",
    )
    add_flags(parser, GATEWAY_POLICY_SETTINGS)
    parser.set_defaults(func=run)
