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
from typing import Any

from promptcache.contract import SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR, FrontEnv, IsolationMode
from promptcache.envflags import EnvFlag, add_flags, as_float, as_int, as_str, collect
from promptcache.front.settings import (
    FrontSettings,
    SettingsError,
    default_cache_gib,
    parse_bool,
)


def _mode(name: str, raw: str) -> IsolationMode:
    try:
        return IsolationMode(raw)
    except ValueError:
        choices = ", ".join(m.value for m in IsolationMode)
        raise SettingsError(f"{name}={raw!r} is not one of {choices}") from None


OPTIONS: tuple[EnvFlag, ...] = (
    EnvFlag("--upstream", FrontEnv.UPSTREAM, "upstream", as_str, "vLLM's base URL (localhost)"),
    EnvFlag("--listen", FrontEnv.LISTEN, "listen", as_str, "HOST:PORT to serve on"),
    EnvFlag(
        "--isolation-mode",
        FrontEnv.ISOLATION_MODE,
        "isolation_mode",
        _mode,
        "Shared, PerKey or Required",
    ),
    EnvFlag(
        "--isolation-header",
        FrontEnv.ISOLATION_HEADER,
        "isolation_header",
        as_str,
        "request header carrying the isolation key",
    ),
    EnvFlag(
        "--isolation-field",
        FrontEnv.ISOLATION_FIELD,
        "isolation_field",
        as_str,
        "body field carrying the isolation key",
    ),
    EnvFlag(
        "--salt-key-file",
        FrontEnv.SALT_KEY_FILE,
        "salt_key_file",
        as_str,
        "file holding the HMAC secret for salts (PerKey/Required)",
    ),
    EnvFlag(
        "--honor-prompt-cache-max-len",
        FrontEnv.HONOR_MAX_LEN,
        "honor_prompt_cache_max_len",
        parse_bool,
        "true: prompt_cache_max_len 0 makes a request uncacheable",
    ),
    EnvFlag(
        "--session-header",
        FrontEnv.SESSION_HEADER,
        "session_header",
        as_str,
        "session-affinity header; empty: never set it",
        empty_disables=True,
    ),
    EnvFlag(
        "--session-from-user",
        FrontEnv.SESSION_FROM_USER,
        "session_from_user",
        parse_bool,
        "copy the body's `user` into the session header when it is absent",
    ),
    EnvFlag(
        "--prompt-tokens-header",
        FrontEnv.PROMPT_TOKENS_HEADER,
        "prompt_tokens_header",
        as_str,
        "response header with the prompt token count; empty: off",
        empty_disables=True,
    ),
    EnvFlag(
        "--cached-prompt-tokens-header",
        FrontEnv.CACHED_PROMPT_TOKENS_HEADER,
        "cached_prompt_tokens_header",
        as_str,
        "response header with the cached prompt token count; empty: off",
        empty_disables=True,
    ),
    EnvFlag(
        "--max-body-bytes",
        FrontEnv.MAX_BODY_BYTES,
        "max_body_bytes",
        as_int,
        "largest request body accepted (413 above)",
    ),
    EnvFlag(
        "--prompt-embeds-cache-gib",
        SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR,
        "prompt_embeds_cache_gib",
        as_float,
        "prompt-embeds cache size per process; 0 = off",
    ),
    EnvFlag(
        "--workers",
        FrontEnv.WORKERS,
        "workers",
        as_int,
        "front processes on the port (SO_REUSEPORT), one per vLLM API server",
    ),
    EnvFlag(
        "--max-in-flight",
        FrontEnv.MAX_IN_FLIGHT,
        "max_in_flight",
        as_int,
        "requests worked on at once per process (503 above)",
    ),
    EnvFlag(
        "--max-in-flight-bytes",
        FrontEnv.MAX_IN_FLIGHT_BYTES,
        "max_in_flight_bytes",
        as_int,
        "request bytes held at once per process (503 above)",
    ),
    EnvFlag(
        "--decode-workers",
        FrontEnv.DECODE_WORKERS,
        "decode_workers",
        as_int,
        "threads for payload decoding and hashing",
    ),
    EnvFlag(
        "--turboquant-dtype",
        FrontEnv.TURBOQUANT_DTYPE,
        "turboquant_dtype",
        as_str,
        "dtype TurboQuant payloads are decoded to: auto, float32, float16, bfloat16",
    ),
    EnvFlag(
        "--upstream-timeout-seconds",
        FrontEnv.UPSTREAM_TIMEOUT_SECONDS,
        "upstream_timeout_seconds",
        as_float,
        "longest silence from vLLM before 504",
    ),
    EnvFlag(
        "--max-body-reads",
        FrontEnv.MAX_BODY_READS,
        "max_body_reads",
        as_int,
        "request bodies received at once per process (503 above; apart from --max-in-flight)",
    ),
    EnvFlag(
        "--header-timeout-seconds",
        FrontEnv.HEADER_TIMEOUT_SECONDS,
        "header_timeout_seconds",
        as_float,
        "time to deliver a request's headers; also the idle keep-alive time",
    ),
    EnvFlag(
        "--body-timeout-seconds",
        FrontEnv.BODY_TIMEOUT_SECONDS,
        "body_timeout_seconds",
        as_float,
        "time to deliver a whole request body (408 after)",
    ),
    EnvFlag(
        "--max-prompt-embeds-references",
        FrontEnv.MAX_PROMPT_EMBEDS_REFERENCES,
        "max_prompt_embeds_references",
        as_int,
        "prompt-embeds payloads and references one request may carry (400 above)",
    ),
)


def _defaults() -> dict[str, Any]:
    defaults = FrontSettings()
    return {opt.field: getattr(defaults, opt.field) for opt in OPTIONS}


def settings_from(args: argparse.Namespace, environ: Mapping[str, str]) -> FrontSettings:
    """Flags over environment over built-in defaults, validated."""
    values = collect(OPTIONS, args, environ, error=SettingsError)
    if getattr(args, "prompt_embeds_cache_gib", None) is None:
        # spec/000's variable has its own contract: unset or 0 is off, garbage is an error.
        values["prompt_embeds_cache_gib"] = default_cache_gib(environ)
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
    add_flags(parser, OPTIONS, _defaults())


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
