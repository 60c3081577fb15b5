"""Turning validation failures into one line per problem that names the field and the fix.

Users meet these messages in the CLI (`promptcache render`) and in the
operator's Degraded condition. pydantic's own wording ("Input should be greater
than 0") is written for Python programmers; ours reads like the API server's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from promptcache.api.k8s import SUBPATH_MARK
from promptcache.api.rules import RULE_SEPARATOR, field_path_of


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input, at one field path."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class InvalidResourceError(ValueError):
    """The input is not a valid PromptCacheDeployment; `problems` lists each reason."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


def format_path(loc: Iterable[int | str]) -> str:
    """`("spec", "tiers", 1, "name")` → `spec.tiers[1].name`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _choices(expected: Any) -> str:
    text = str(expected).replace("'", "")
    return text.replace(" or ", ", ")


_TYPE_WORDS = {
    "int_type": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "missing": "required field is missing",
    "extra_forbidden": "unknown field",
    "finite_number": "must be a finite number",
}


def _message(error: ErrorDetails) -> str:
    kind = error["type"]
    ctx: dict[str, Any] = dict(error.get("ctx") or {})
    if kind in _TYPE_WORDS:
        return _TYPE_WORDS[kind]
    bounds = {
        "greater_than": ("gt", ">"),
        "greater_than_equal": ("ge", ">="),
        "less_than": ("lt", "<"),
        "less_than_equal": ("le", "<="),
    }
    if kind in bounds:
        key, symbol = bounds[kind]
        bound = ctx[key]
        shown = f"{bound:g}" if isinstance(bound, float) else str(bound)
        return f"must be {symbol} {shown}"
    if kind in ("literal_error", "enum"):
        return f"must be one of: {_choices(ctx.get('expected'))}"
    if kind == "string_too_short":
        minimum = ctx.get("min_length", 1)
        return "must not be empty" if minimum == 1 else f"must be at least {minimum} characters"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters"
    if kind == "too_long":
        return f"must have at most {ctx.get('max_length')} items"
    if kind == "string_pattern_mismatch":
        return f"must match the pattern {ctx.get('pattern')}"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    return str(error["msg"])


def problems_from(error: ValidationError, *, prefix: Sequence[int | str] = ()) -> list[Problem]:
    """One Problem per pydantic error, paths in the resource's own camelCase spelling.

    A broken cross-field rule is reported at the field its CEL twin names, so the CLI
    and the API server point at the same place.
    """
    problems: list[Problem] = []
    for e in error.errors(include_url=False):
        loc = [*prefix, *e["loc"]]
        message = _message(e)
        if e["type"] != "value_error":
            problems.append(Problem(format_path(loc), message))
            continue
        for part in message.split(RULE_SEPARATOR):
            if part.startswith(SUBPATH_MARK) and ": " in part:
                sub, text = part[len(SUBPATH_MARK) :].split(": ", 1)
                problems.append(Problem(f"{format_path(loc)}{_sub_path(sub)}", text))
                continue
            field_path = field_path_of(part)
            extra = field_path.lstrip(".").split(".") if field_path else []
            problems.append(Problem(format_path([*loc, *extra]), part))
    return problems


def _sub_path(sub: str) -> str:
    """`a.b[0]` below a field: `.a.b[0]`; `[0].a`: `[0].a`."""
    return sub if sub.startswith("[") else f".{sub}"
