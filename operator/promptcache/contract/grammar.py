"""What a header name and a body-field name may be: one grammar for every plane.

The API model (and so the CRD pattern), the cache front and the gateway policy step all
check names with these functions, so a name the API accepts is a name the
processes start with, and a name they refuse the API refuses first.

- A header name is an HTTP field name, an RFC 9110 `token`
  (``!#$%&'*+-.^_`|~``, digits, letters), kept in lower case: HTTP/2 carries
  header names in lower case and HTTP/1.1 compares them case-insensitively, so
  the resource stores the canonical form and the processes fold what a person
  types on a command line (`X-Tenant` -> `x-tenant`) before checking it.
- A body-field name is a JSON key the front pops from the request body: an
  identifier (`[A-Za-z_][A-Za-z0-9_]*`), like every field of the OpenAI API.
- Where a name is optional, the empty string means "do not read one"; it never
  means "use the default".
"""

from __future__ import annotations

import re
from typing import Final

HEADER_TOKEN_CHARS: Final[str] = r"a-z0-9!#$%&'*+.^_`|~-"  # noqa: S105 - not a secret
HEADER_NAME_PATTERN: Final[str] = rf"^[{HEADER_TOKEN_CHARS}]+$"
"""An HTTP field name (RFC 9110 token), lower-case as HTTP/2 requires."""
OPTIONAL_HEADER_NAME_PATTERN: Final[str] = rf"^([{HEADER_TOKEN_CHARS}]+)?$"
HEADER_NAME_MAX_LENGTH: Final[int] = 256
BODY_FIELD_PATTERN: Final[str] = r"^[A-Za-z_][A-Za-z0-9_]*$"
OPTIONAL_BODY_FIELD_PATTERN: Final[str] = r"^([A-Za-z_][A-Za-z0-9_]*)?$"
BODY_FIELD_MAX_LENGTH: Final[int] = 128

_HEADER_RE: Final = re.compile(HEADER_NAME_PATTERN)
_FIELD_RE: Final = re.compile(BODY_FIELD_PATTERN)


class GrammarError(ValueError):
    """A name outside the grammar; the message names the setting and the rule."""


def canonical_header_name(raw: str) -> str:
    """The form the resource stores and HTTP/2 sends: lower case, no surrounding blanks."""
    return raw.strip().lower()


def is_header_name(value: str) -> bool:
    """True for a lower-case RFC 9110 token of at most HEADER_NAME_MAX_LENGTH characters."""
    return len(value) <= HEADER_NAME_MAX_LENGTH and _HEADER_RE.fullmatch(value) is not None


def is_body_field(value: str) -> bool:
    """True for an identifier of at most BODY_FIELD_MAX_LENGTH characters."""
    return len(value) <= BODY_FIELD_MAX_LENGTH and _FIELD_RE.fullmatch(value) is not None


def header_name_problem(value: str, *, optional: bool) -> str | None:
    """Why `value` is not a header name (empty allowed when `optional`), or None."""
    if (optional and value == "") or is_header_name(value):
        return None
    empty = " (empty: do not read one)" if optional else ""
    return (
        "is not an HTTP header name: use lower-case letters, digits and !#$%&'*+-.^_`|~ "
        f"(at most {HEADER_NAME_MAX_LENGTH} characters){empty}"
    )


def body_field_problem(value: str, *, optional: bool) -> str | None:
    """Why `value` is not a body-field name (empty allowed when `optional`), or None."""
    if (optional and value == "") or is_body_field(value):
        return None
    empty = " (empty: do not read one)" if optional else ""
    return (
        "is not a body field name: use letters, digits and _, not starting with a digit "
        f"(at most {BODY_FIELD_MAX_LENGTH} characters){empty}"
    )


def check_header_name(label: str, value: str, *, optional: bool) -> str:
    """`value` if it is a header name (or empty, when `optional`), else GrammarError."""
    problem = header_name_problem(value, optional=optional)
    if problem is not None:
        raise GrammarError(f"{label}={value!r} {problem}")
    return value


def check_body_field(label: str, value: str, *, optional: bool) -> str:
    """`value` if it is a body-field name (or empty, when `optional`), else GrammarError."""
    problem = body_field_problem(value, optional=optional)
    if problem is not None:
        raise GrammarError(f"{label}={value!r} {problem}")
    return value
