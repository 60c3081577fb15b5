"""Settings that come from a flag or an environment variable, the flag winning.

The data-plane processes (the cache front, the gateway policy step) are configured by
the renderer through environment variables and by people through flags. Each
setting is declared once, as a `Setting` row (field, flag, variable, parser, default,
help, bounds or check), in `contract.front` or `contract.gateway_policy`; the renderer
writes the variable with the matching `format_*` function, the process reads it back
with the row's parser, and the process' settings class checks every value against its
row (`check_rows`), however the value was given. Only rules between settings (a budget
that must hold one maximal body, a mode that needs a carrier) stay with the settings
class. Env is read when the command runs, not when the parser is built, and every
flag's help names its variable and default. Every failure is a `SettingsError`.

An empty variable is "unset" (Kubernetes renders `value: ""` for a blank) unless
the setting says otherwise: for an optional name (`empty_is_unset=False`) the
empty string is a value meaning "do not read one", and for the prompt-embeds
cache size it is an error.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, Generic, TypeVar

from promptcache.contract.grammar import (
    GrammarError,
    canonical_header_name,
    check_body_field,
    check_header_name,
)
from promptcache.contract.names import IsolationMode

T = TypeVar("T")


class SettingsError(ValueError):
    """A data-plane setting that cannot be read or can never work: text that does not
    parse, a value out of its row's bounds, settings that contradict each other, an
    unusable salt key. The one settings error of the front, the policy step and the
    policy; the message names the setting (flag or variable) and the fix."""


Number = TypeVar("Number", int, float)


@dataclass(frozen=True, slots=True)
class Bounds(Generic[Number]):
    """The range a number setting must lie in: `[low, high]`, `(low, high]` when
    `above` (the low end excluded), either end left open by None."""

    low: Number | None = None
    high: Number | None = None
    above: bool = False

    def problem(self, value: Number) -> str | None:
        """Why `value` is outside (the end of a message after `NAME=value`), or None."""
        low_ok = self.low is None or (value > self.low if self.above else value >= self.low)
        if low_ok and (self.high is None or value <= self.high):
            return None
        low, high = _shown(self.low), _shown(self.high)
        if self.high is None:
            return f"must be more than {low}" if self.above else f"must be at least {low}"
        if self.low is None:
            return f"must be at most {high}"
        return f"must be in {'(' if self.above else '['}{low}, {high}]"


def _shown(bound: float | None) -> str:
    return format_float(bound) if isinstance(bound, float) else str(bound)


@dataclass(frozen=True, slots=True)
class Setting(Generic[T]):
    """One setting, one row: its settings field, flag, environment variable, parser,
    default, help, and the bounds or check every value of it must pass."""

    field: str
    flag: str
    env: str
    parse: Callable[[str, str], T]
    """`(name, raw) -> value`, raising SettingsError with `name` in the message."""
    default: T
    help: str
    empty_is_unset: bool = True
    """False: an empty variable is passed to `parse` (a value, e.g. "do not read one")."""
    bounds: Bounds[Any] | None = None
    """A number's range; a value outside is refused naming the flag and the range."""
    check: Callable[[str, T], object] | None = None
    """`(flag, value)`, raising SettingsError: what a parsed or directly given value must
    satisfy beyond its type (an address, a header name). Its return value is ignored."""


# --- parsers: (name, raw) -> value; `name` is the flag or variable, for the message --------


def as_str(_name: str, raw: str) -> str:
    return raw


def as_int(name: str, raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None


def as_float(name: str, raw: str) -> float:
    """A finite number (`inf`, `nan` and `1e400` are refused, never a traceback)."""
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise SettingsError(f"{name}={raw!r} is not a finite number")
    return value


_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})


def parse_bool(name: str, raw: str) -> bool:
    """Read a boolean the way people write them in YAML and shells."""
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SettingsError(f"{name}={raw!r} is not a boolean; use true or false")


def format_bool(value: bool) -> str:
    """How the renderer writes a boolean `parse_bool` reads back."""
    return "true" if value else "false"


def format_float(value: float) -> str:
    """How the renderer writes a number `as_float` reads back exactly: short when that is
    exact (`30`, `0.5`), else the shortest round-tripping repr (`0.001953125`, not the
    `0.00195312` that `:g` would round it to)."""
    short = f"{value:g}"
    return short if float(short) == value else repr(float(value))


def parse_isolation_mode(name: str, raw: str) -> IsolationMode:
    try:
        return IsolationMode(raw.strip())
    except ValueError:
        choices = ", ".join(m.value for m in IsolationMode)
        raise SettingsError(f"{name}={raw!r} is not one of {choices}") from None


def _name(check: Callable[..., str], name: str, value: str, *, optional: bool) -> str:
    try:
        return check(name, value, optional=optional)
    except GrammarError as exc:
        raise SettingsError(str(exc)) from None


def parse_header_name(name: str, raw: str) -> str:
    """A header name (folded to lower case); empty is refused."""
    return _name(check_header_name, name, canonical_header_name(raw), optional=False)


def parse_optional_header_name(name: str, raw: str) -> str:
    """A header name (folded to lower case), or empty: "do not read/send one"."""
    return _name(check_header_name, name, canonical_header_name(raw), optional=True)


def parse_body_field(name: str, raw: str) -> str:
    """A body-field name; empty is refused."""
    return _name(check_body_field, name, raw.strip(), optional=False)


def parse_optional_body_field(name: str, raw: str) -> str:
    """A body-field name, or empty: "do not read one"."""
    return _name(check_body_field, name, raw.strip(), optional=True)


_HOST_PORT: Final = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})$")


def split_host_port(name: str, raw: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 hosts in brackets) into its parts, or SettingsError."""
    match = _HOST_PORT.match(raw)
    if match is None or int(match.group(2)) > 65535:
        raise SettingsError(f"{name}={raw!r} is not HOST:PORT (e.g. 0.0.0.0:8000)")
    return match.group(1).strip("[]"), int(match.group(2))


def parse_host_port(name: str, raw: str) -> str:
    """A `HOST:PORT` setting, checked and kept as text."""
    split_host_port(name, raw.strip())
    return raw.strip()


def parse_optional_host_port(name: str, raw: str) -> str:
    """A `HOST:PORT` setting, or empty: "do not listen"."""
    return parse_host_port(name, raw) if raw.strip() else ""


def check_host_port(name: str, value: str) -> None:
    """A `HOST:PORT` value, or SettingsError."""
    split_host_port(name, value)


def check_optional_host_port(name: str, value: str) -> None:
    """A `HOST:PORT` value or empty ("do not listen"), or SettingsError."""
    if value:
        split_host_port(name, value)


def check_optional_header_name(name: str, value: str) -> None:
    """A header name or empty (the grammar the API checks; empty: do not read/send one)."""
    _name(check_header_name, name, value, optional=True)


def check_optional_body_field(name: str, value: str) -> None:
    """A body-field name or empty (empty: do not read one)."""
    _name(check_body_field, name, value, optional=True)


# --- reading them and checking them ------------------------------------------------------


def defaults(settings: Iterable[Setting[Any]]) -> dict[str, Any]:
    return {s.field: s.default for s in settings}


def collect(
    settings: Iterable[Setting[Any]],
    args: argparse.Namespace,
    environ: Mapping[str, str],
) -> dict[str, Any]:
    """The given values, flags over environment; unset ones are left to the defaults.

    A text that does not parse is a SettingsError naming the flag or variable it came in.
    """
    values: dict[str, Any] = {}
    for opt in settings:
        flag_value: str | None = getattr(args, opt.field, None)
        if flag_value is not None:
            values[opt.field] = opt.parse(opt.flag, flag_value)
            continue
        raw = environ.get(opt.env)
        if raw is None or (not raw.strip() and opt.empty_is_unset):
            continue
        values[opt.field] = opt.parse(opt.env, raw)
    return values


def check_rows(settings: Iterable[Setting[Any]], values: object) -> None:
    """Every row's bounds and check over `values` (a settings object with a field per
    row), in row order, so the first wrong setting is the one named: the one place a
    settings class validates its single values."""
    for opt in settings:
        value = getattr(values, opt.field)
        if opt.bounds is not None:
            problem = opt.bounds.problem(value)
            if problem is not None:
                raise SettingsError(f"{opt.flag}={value!r} {problem}")
        if opt.check is not None:
            opt.check(opt.flag, value)


def add_flags(parser: argparse.ArgumentParser, settings: Iterable[Setting[Any]]) -> None:
    """Add each flag (default None, so "not given" is visible), documented with its env var."""
    for opt in settings:
        shown = opt.default.value if isinstance(opt.default, Enum) else opt.default
        parser.add_argument(
            opt.flag,
            dest=opt.field,
            default=None,
            help=f"{opt.help} (env {opt.env}; default {shown!r})",
        )
