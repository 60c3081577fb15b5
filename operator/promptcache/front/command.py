"""`promptcache front`: flags and environment variables into `FrontSettings`.

Every setting has a flag and an environment variable (`contract.FrontEnv`, set
by the renderer); the flag wins. Env is read when the command runs, not when
the parser is built, so a test or wrapper that sets env late still counts.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from promptcache.contract import SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR, FrontEnv, IsolationMode
from promptcache.front.settings import (
    FrontSettings,
    SettingsError,
    default_cache_gib,
    env_value,
    parse_bool,
)


@dataclass(frozen=True, slots=True)
class _Option:
    flag: str
    env: str
    field: str
    convert: Callable[[str, str], Any]
    help: str
    empty_disables: bool = False
    """An empty value is meaningful (switches the feature off), not "unset"."""


def _str(_name: str, raw: str) -> str:
    return raw


def _int(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None


def _float(name: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None


def _mode(name: str, raw: str) -> IsolationMode:
    try:
        return IsolationMode(raw)
    except ValueError:
        choices = ", ".join(m.value for m in IsolationMode)
        raise SettingsError(f"{name}={raw!r} is not one of {choices}") from None


OPTIONS: tuple[_Option, ...] = (
    _Option("--upstream", FrontEnv.UPSTREAM, "upstream", _str, "vLLM's base URL (localhost)"),
    _Option("--listen", FrontEnv.LISTEN, "listen", _str, "HOST:PORT to serve on"),
    _Option(
        "--isolation-mode",
        FrontEnv.ISOLATION_MODE,
        "isolation_mode",
        _mode,
        "Shared, PerKey or Required",
    ),
    _Option(
        "--isolation-header",
        FrontEnv.ISOLATION_HEADER,
        "isolation_header",
        _str,
        "request header carrying the isolation key",
    ),
    _Option(
        "--isolation-field",
        FrontEnv.ISOLATION_FIELD,
        "isolation_field",
        _str,
        "body field carrying the isolation key",
    ),
    _Option(
        "--salt-key-file",
        FrontEnv.SALT_KEY_FILE,
        "salt_key_file",
        _str,
        "file holding the HMAC secret for salts (PerKey/Required)",
    ),
    _Option(
        "--honor-prompt-cache-max-len",
        FrontEnv.HONOR_MAX_LEN,
        "honor_prompt_cache_max_len",
        parse_bool,
        "true: prompt_cache_max_len 0 makes a request uncacheable",
    ),
    _Option(
        "--session-header",
        FrontEnv.SESSION_HEADER,
        "session_header",
        _str,
        "session-affinity header; empty: never set it",
        empty_disables=True,
    ),
    _Option(
        "--session-from-user",
        FrontEnv.SESSION_FROM_USER,
        "session_from_user",
        parse_bool,
        "copy the body's `user` into the session header when it is absent",
    ),
    _Option(
        "--prompt-tokens-header",
        FrontEnv.PROMPT_TOKENS_HEADER,
        "prompt_tokens_header",
        _str,
        "response header with the prompt token count; empty: off",
        empty_disables=True,
    ),
    _Option(
        "--cached-prompt-tokens-header",
        FrontEnv.CACHED_PROMPT_TOKENS_HEADER,
        "cached_prompt_tokens_header",
        _str,
        "response header with the cached prompt token count; empty: off",
        empty_disables=True,
    ),
    _Option(
        "--max-body-bytes",
        FrontEnv.MAX_BODY_BYTES,
        "max_body_bytes",
        _int,
        "largest request body accepted (413 above)",
    ),
    _Option(
        "--prompt-embeds-cache-gib",
        SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR,
        "prompt_embeds_cache_gib",
        _float,
        "prompt-embeds cache size per process; 0 = off",
    ),
    _Option(
        "--workers",
        FrontEnv.WORKERS,
        "workers",
        _int,
        "front processes on the port (SO_REUSEPORT), one per vLLM API server",
    ),
    _Option(
        "--max-in-flight",
        FrontEnv.MAX_IN_FLIGHT,
        "max_in_flight",
        _int,
        "requests worked on at once per process (503 above)",
    ),
    _Option(
        "--max-in-flight-bytes",
        FrontEnv.MAX_IN_FLIGHT_BYTES,
        "max_in_flight_bytes",
        _int,
        "request bytes held at once per process (503 above)",
    ),
    _Option(
        "--decode-workers",
        FrontEnv.DECODE_WORKERS,
        "decode_workers",
        _int,
        "threads for payload decoding and hashing",
    ),
    _Option(
        "--turboquant-dtype",
        FrontEnv.TURBOQUANT_DTYPE,
        "turboquant_dtype",
        _str,
        "dtype TurboQuant payloads are decoded to: auto, float32, float16, bfloat16",
    ),
    _Option(
        "--upstream-timeout-seconds",
        FrontEnv.UPSTREAM_TIMEOUT_SECONDS,
        "upstream_timeout_seconds",
        _float,
        "longest silence from vLLM before 504",
    ),
)


def _defaults() -> dict[str, Any]:
    defaults = FrontSettings()
    return {opt.field: getattr(defaults, opt.field) for opt in OPTIONS}


def settings_from(args: argparse.Namespace, environ: Mapping[str, str]) -> FrontSettings:
    """Flags over environment over built-in defaults, validated."""
    values: dict[str, Any] = {}
    for opt in OPTIONS:
        flag_value: str | None = getattr(args, opt.field, None)
        if flag_value is not None:
            values[opt.field] = opt.convert(opt.flag, flag_value)
            continue
        if opt.env == SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR:
            values[opt.field] = default_cache_gib(environ)
            continue
        raw = environ.get(opt.env) if opt.empty_disables else env_value(environ, opt.env)
        if raw is not None:
            values[opt.field] = opt.convert(opt.env, raw)
    return FrontSettings(**values)


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
    defaults = _defaults()
    for opt in OPTIONS:
        default = defaults[opt.field]
        shown = default.value if isinstance(default, IsolationMode) else default
        parser.add_argument(
            opt.flag,
            dest=opt.field,
            default=None,
            help=f"{opt.help} (env {opt.env}; default {shown})",
        )


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `front` sub-command to the `promptcache` CLI."""
    parser = subparsers.add_parser(
        "front",
        help="run the cache front in a model-server pod",
        description="The cache front: isolation salts, prompt embeds by reference, usage "
        "headers and merged metrics in front of vLLM on localhost. Every flag can also "
        "be set by its environment variable; the flag wins.",
    )
    add_arguments(parser)
    parser.set_defaults(func=run)
