"""The base every API model shares: camelCase on the wire, strict types, no unknown keys.

Strict so that the CLI refuses exactly what the API server would refuse (a
string where an integer belongs is a mistake, not something to coerce), and
`extra="forbid"` so a typo in a field name is an error rather than a silently
ignored setting. Attribute docstrings become the field descriptions of the CRD
and of the docs table, so each fact is written once.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, PlainValidator, StringConstraints, WithJsonSchema
from pydantic.alias_generators import to_camel

from promptcache.contract.grammar import (
    BODY_FIELD_MAX_LENGTH,
    HEADER_NAME_MAX_LENGTH,
    HEADER_NAME_PATTERN,
    OPTIONAL_BODY_FIELD_PATTERN,
    OPTIONAL_HEADER_NAME_PATTERN,
    body_field_problem,
    header_name_problem,
)


class ApiModel(BaseModel):
    """Base of every model in the resource."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        strict=True,
        frozen=True,
        use_attribute_docstrings=True,
        validate_default=False,
    )


DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)

DnsLabel = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]
ObjectName = Annotated[
    str,
    StringConstraints(
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
    ),
]


def _named(
    problem_of: Callable[..., str | None], *, optional: bool, pattern: str, max_length: int
) -> Any:
    """A str type checked by the contract's grammar (the message the front and shim give too),
    with the same pattern in the CRD so the API server refuses what the processes would."""

    def check(value: object) -> str:
        if not isinstance(value, str):
            raise ValueError("must be a string")
        problem = problem_of(value, optional=optional)
        if problem is not None:
            raise ValueError(f"{value!r} {problem}")
        return value

    schema = {"type": "string", "maxLength": max_length, "pattern": pattern}
    return Annotated[str, PlainValidator(check), WithJsonSchema(schema)]


HeaderName = _named(
    header_name_problem,
    optional=False,
    pattern=HEADER_NAME_PATTERN,
    max_length=HEADER_NAME_MAX_LENGTH,
)
OptionalHeaderName = _named(
    header_name_problem,
    optional=True,
    pattern=OPTIONAL_HEADER_NAME_PATTERN,
    max_length=HEADER_NAME_MAX_LENGTH,
)
OptionalBodyField = _named(
    body_field_problem,
    optional=True,
    pattern=OPTIONAL_BODY_FIELD_PATTERN,
    max_length=BODY_FIELD_MAX_LENGTH,
)
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)


def _quantity(value: object) -> int | str:
    """Accept what the API server accepts for a quantity: an integer or a quantity string."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError("must be a quantity such as 4, 500m or 64Gi")
    if isinstance(value, str) and not _QUANTITY_RE.match(value):
        raise ValueError(f"{value!r} is not a quantity (examples: 4, 500m, 64Gi)")
    return value


Quantity = Annotated[
    int | str,
    PlainValidator(_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]
ImageRef = Annotated[str, StringConstraints(min_length=1, max_length=512, pattern=r"^\S+$")]
