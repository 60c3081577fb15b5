"""Is the desired manifest already live? The test that makes an idle resync write nothing.

The operator does not re-apply blindly: it reads each child and applies only
when the rendered manifest is not contained in the live object. Containment is
judged the way the API server stores things:

- fields the server or other managers add (status, defaults, an annotation a
  person added) are ignored: only what the operator renders is compared;
- a zero value the operator renders ("" , 0, false, {}, []) matches an absent
  field, because the server drops omitempty zero values;
- quantities compare by value (`2048Mi` is stored as `2Gi`, `1` as `"1"`);
- lists of named items (containers, env, volumes, ports) match by name, so an
  extra env var someone adds does not count; other lists compare in order.

A spec change that only *removes* something (an env var no longer rendered) is
not visible to containment, so every child carries a hash of its rendered form
in an annotation: a changed hash is a missing field like any other.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from promptcache.api.constants import GROUP

HASH_ANNOTATION: Final[str] = f"{GROUP}/rendered-hash"

_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|"
    r"[eE][+-]?[0-9]+)?$"
)
_SUFFIX: Final[dict[str, Decimal]] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_QUANTITY_PARENTS: Final[frozenset[str]] = frozenset({"requests", "limits", "hard", "capacity"})
_QUANTITY_KEYS: Final[frozenset[str]] = frozenset({"sizeLimit", "storage"})


def quantity_value(value: object) -> Decimal | None:
    """The numeric value of a Kubernetes quantity, or None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return Decimal(str(value))
    if not isinstance(value, str):
        return None
    match = _QUANTITY.match(value)
    if match is None:
        return None
    number, suffix = match.group(1), match.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number + suffix)
        return Decimal(number) * _SUFFIX[suffix]
    except (InvalidOperation, KeyError):
        return None


def _is_zero(value: object) -> bool:
    return value is None or value == "" or value is False or value == 0 or value in ({}, [])


def _scalar_equal(desired: object, live: object, key: str, parent: str) -> bool:
    if desired == live and type(desired) is type(live):
        return True
    if parent in _QUANTITY_PARENTS or key in _QUANTITY_KEYS:
        a, b = quantity_value(desired), quantity_value(live)
        return a is not None and a == b
    # Integers and floats the server may echo in the other numeric type (1 vs 1.0).
    numeric = (int, float)
    if (
        isinstance(desired, numeric)
        and isinstance(live, numeric)
        and not isinstance(desired, bool)
        and not isinstance(live, bool)
    ):
        return float(desired) == float(live)
    return False


def _named(items: Sequence[Any]) -> bool:
    return bool(items) and all(isinstance(i, Mapping) and "name" in i for i in items)


def is_subset(desired: Any, live: Any, *, key: str = "", parent: str = "") -> bool:
    """True when everything in `desired` is present, with an equal value, in `live`."""
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return _is_zero(desired) and live is None
        for k, value in desired.items():
            if k not in live or live[k] is None:
                if _is_zero(value):
                    continue
                return False
            if not is_subset(value, live[k], key=str(k), parent=key):
                return False
        return True
    if isinstance(desired, list):
        if not isinstance(live, list):
            return not desired and live is None
        if _named(desired) and _named(live):
            by_name = {item["name"]: item for item in live}
            return all(
                item["name"] in by_name and is_subset(item, by_name[item["name"]], parent=key)
                for item in desired
            )
        if len(desired) != len(live):
            return False
        return all(
            is_subset(d, v, key=key, parent=parent) for d, v in zip(desired, live, strict=True)
        )
    return _scalar_equal(desired, live, key, parent)


def rendered_hash(manifest: Mapping[str, Any]) -> str:
    """A short, stable digest of a rendered manifest (without the hash annotation itself)."""
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def needs_apply(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> bool:
    """Apply when the child is missing, was hand-edited in an owned field, or the render changed."""
    return live is None or not is_subset(desired, live)
