"""Settings that come from a flag or an environment variable, the flag winning.

The data-plane processes (the cache front, the session shim) are configured by
the renderer through environment variables and by people through flags. Both
read them the same way, through this module: env is read when the command runs,
not when the parser is built, and every flag's help names its variable and default.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any


class SettingInputError(ValueError):
    """A flag or variable whose text does not parse; the message names it and the value."""


@dataclass(frozen=True, slots=True)
class EnvFlag:
    """One setting: its flag, its environment variable and the settings field it fills."""

    flag: str
    env: str
    field: str
    convert: Callable[[str, str], Any]
    """`(name, raw) -> value`, raising SettingInputError with `name` in the message."""
    help: str
    empty_disables: bool = False
    """An empty variable means "off" (the renderer writes `value: ""`), not "unset"."""


def as_str(_name: str, raw: str) -> str:
    return raw


def as_int(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise SettingInputError(f"{name}={raw!r} is not an integer") from None


def as_float(name: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise SettingInputError(f"{name}={raw!r} is not a number") from None


def collect(
    options: Iterable[EnvFlag],
    args: argparse.Namespace,
    environ: Mapping[str, str],
    *,
    error: type[ValueError] = SettingInputError,
) -> dict[str, Any]:
    """The given values, flags over environment; unset ones are left to the defaults.

    Conversion failures are raised as `error`, the caller's own settings error.
    """
    values: dict[str, Any] = {}
    try:
        for opt in options:
            flag_value: str | None = getattr(args, opt.field, None)
            if flag_value is not None:
                values[opt.field] = opt.convert(opt.flag, flag_value)
                continue
            raw = environ.get(opt.env)
            if raw is None or (not raw.strip() and not opt.empty_disables):
                continue
            values[opt.field] = opt.convert(opt.env, raw)
    except SettingInputError as exc:
        raise error(str(exc)) from None
    return values


def add_flags(
    parser: argparse.ArgumentParser, options: Iterable[EnvFlag], defaults: Mapping[str, Any]
) -> None:
    """Add each flag (default None, so "not given" is visible), documented with its env var."""
    for opt in options:
        default = defaults[opt.field]
        shown = default.value if isinstance(default, Enum) else default
        parser.add_argument(
            opt.flag,
            dest=opt.field,
            default=None,
            help=f"{opt.help} (env {opt.env}; default {shown})",
        )
