"""`promptcache session-shim`: flags and environment variables into `ShimSettings`.

Every setting has a flag and an environment variable (`contract.SessionShimEnv`, set by
the renderer on the EPP pod's `session-shim` container); the flag wins. This module
imports no gRPC: the CLI lists the sub-command in every install, and only running it
needs the `gateway` extra (`pip install 'promptcache[gateway]'`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from promptcache.contract.settings import add_flags, collect
from promptcache.contract.shim import SHIM_SETTINGS
from promptcache.gateway.settings import ShimSettings, ShimSettingsError

EXIT_BAD_SETTINGS = 2
EXIT_MISSING_EXTRA = 3


def settings_from(args: argparse.Namespace, environ: Mapping[str, str]) -> ShimSettings:
    """Flags over environment over built-in defaults, validated."""
    return ShimSettings(**collect(SHIM_SETTINGS, args, environ, error=ShimSettingsError))


def run(args: argparse.Namespace) -> int:
    """The `session-shim` sub-command's body."""
    try:
        settings = settings_from(args, os.environ)
    except ShimSettingsError as error:
        print(f"promptcache session-shim: {error}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    try:
        # gRPC only when the shim really runs: `promptcache` works without the extra.
        from promptcache.gateway.session_shim import serve  # noqa: PLC0415
    except ModuleNotFoundError as error:
        print(
            f"promptcache session-shim: needs {error.name!r}; install the gateway extra: "
            "pip install 'promptcache[gateway]'",
            file=sys.stderr,
        )
        return EXIT_MISSING_EXTRA
    return serve(settings)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `session-shim` sub-command to the `promptcache` CLI."""
    parser = subparsers.add_parser(
        "session-shim",
        help="run the Endpoint Picker's session shim (body `user` -> session header)",
        description="An ext_proc proxy in front of the llm-d Endpoint Picker: when a request "
        "has no session header and its JSON body has a usable `user`, the header is added "
        "before the EPP routes. Every flag can also be set by its environment variable; "
        "the flag wins.",
    )
    add_flags(parser, SHIM_SETTINGS)
    parser.set_defaults(func=run)
