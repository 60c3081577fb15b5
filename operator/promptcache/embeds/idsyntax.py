"""The textual shape of a prompt-embeds identifier (spec/001), without torch.

Kept apart from the hashing code so that anything which only needs to *check*
an identifier taken off the wire (the cache front, a client) can do so without
importing torch.
"""

from __future__ import annotations

import re
from typing import Final, Literal, TypeGuard

PROMPT_EMBEDS_ID_ALGORITHM: Final[Literal["blake3"]] = "blake3"
"""Digest algorithm for prompt-embeds identifiers."""

PROMPT_EMBEDS_ID_PREFIX: Final[str] = f"{PROMPT_EMBEDS_ID_ALGORITHM}:"
"""Prefix every identifier carries, naming the algorithm that produced the digest."""

_DIGEST_HEX_LENGTH: Final[int] = 64

PROMPT_EMBEDS_ID_PATTERN: Final[re.Pattern[str]] = re.compile(
    f"^{re.escape(PROMPT_EMBEDS_ID_PREFIX)}[0-9a-f]{{{_DIGEST_HEX_LENGTH}}}$"
)
"""Exact shape of a well-formed identifier."""

_ID_LENGTH: Final[int] = len(PROMPT_EMBEDS_ID_PREFIX) + _DIGEST_HEX_LENGTH


def is_prompt_embeds_id(value: object) -> TypeGuard[str]:
    """Check whether a value is a syntactically well-formed prompt-embeds identifier.

    Lets the server reject a malformed client-supplied identifier before it
    reaches a cache lookup. `fullmatch` (not `match`) so that `$` cannot accept
    a trailing newline; the length test first keeps huge inputs cheap.
    """
    return (
        isinstance(value, str)
        and len(value) == _ID_LENGTH
        and PROMPT_EMBEDS_ID_PATTERN.fullmatch(value) is not None
    )
