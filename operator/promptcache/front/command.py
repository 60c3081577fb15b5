"""`promptcache front`: flags and environment variables into `FrontSettings`.

Every setting has a flag and an environment variable (`contract.FrontEnv`, set
by the renderer); the flag wins. Env is read when the command runs, not when
the parser is built, so a test or wrapper that sets env late still counts.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from promptcache.contract.front import FRONT_SETTINGS
from promptcache.contract.pods import Command
from promptcache.contract.settings import add_flags, collect
from promptcache.front.settings import FrontSettings, SettingsError


def settings_from(args: argparse.Namespace, environ: Mapping[str, str]) -> FrontSettings:
    """Flags over environment over the contract's defaults, validated."""
    return FrontSettings(**collect(FRONT_SETTINGS, args, environ))


def run(args: argparse.Namespace) -> int:
    """The `front` sub-command's body."""
    # the server pulls in the embeds cache; `--help` should not
    from promptcache.front.server import serve  # noqa: PLC0415

    try:
        settings = settings_from(args, os.environ)
    except SettingsError as exc:
        print(f"promptcache front: {exc}", file=sys.stderr)
        return 2
    return serve(settings)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags, each documented with its env var and default."""
    add_flags(parser, FRONT_SETTINGS)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `front` sub-command to the `promptcache` CLI."""
    parser = subparsers.add_parser(
        Command.FRONT.value,
        help="run the cache front in a model-server pod",
        description="The cache front: isolation salts, prompt embeds by reference, usage "
        "headers and merged metrics in front of vLLM on localhost. Every flag can also "
        "be set by its environment variable; the flag wins.",
    )
    add_arguments(parser)
    parser.set_defaults(func=run)
