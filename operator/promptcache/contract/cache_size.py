"""`SG_PROMPT_EMBEDS_CACHE_GIB` (spec/000): the prompt-embeds cache size, parsed once.

The API field `promptEmbeds.cacheGiB`, the renderer, the cache front and
`embeds.build_cache_from_env` all use these: one bound, one parser, one format.
Unset means 0 (no cache). Anything else must be a finite number of GiB in
[0, MAX_CACHE_GIB]; an empty value, text, `nan`, `inf`, `1e400`, a negative or
an absurd size is refused with a message naming the variable, never silently
read as "off".
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Final

from promptcache.contract.names import SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR
from promptcache.contract.settings import SettingsError, format_float

GIB: Final[int] = 1 << 30
MAX_CACHE_GIB: Final[int] = 1024
"""Per serving process. Larger is a typo (a size in MiB or bytes), not a cache: the API
field has the same bound, so a rendered pod never meets it."""


def _problem(name: str, shown: object) -> SettingsError:
    return SettingsError(
        f"{name}={shown!r} is not a valid prompt-embeds cache size: expected a number of GiB "
        f"from 0 to {MAX_CACHE_GIB:g} such as 2 or 0.5 (0 disables the cache)"
    )


def check_cache_gib(name: str, gib: float) -> float:
    """`gib` if it is a finite size in [0, MAX_CACHE_GIB], else SettingsError."""
    if not math.isfinite(gib) or not 0 <= gib <= MAX_CACHE_GIB:
        raise _problem(name, gib)
    return gib


def parse_cache_gib(name: str, raw: str) -> float:
    """A cache size in GiB, or SettingsError naming `name` (empty is refused)."""
    try:
        gib = float(raw)
    except ValueError:
        raise _problem(name, raw) from None
    try:
        return check_cache_gib(name, gib)
    except SettingsError:
        raise _problem(name, raw) from None


def format_cache_gib(gib: float) -> str:
    """How the renderer writes a size `parse_cache_gib` reads back exactly (`2`, `0.1`)."""
    return format_float(gib)


def cache_gib_to_bytes(gib: float) -> int:
    return int(gib * GIB)


def cache_gib_from_env(environ: Mapping[str, str] | None = None) -> float:
    """The size the variable asks for: 0 when unset; refused when empty or invalid."""
    env = os.environ if environ is None else environ
    raw = env.get(SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR)
    if raw is None:
        return 0.0
    return parse_cache_gib(SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR, raw)
