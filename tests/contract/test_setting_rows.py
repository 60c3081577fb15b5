"""Each data-plane setting is one row: the settings classes are held to their rows.

The settings dataclasses are typed by hand (mypy strict reads their fields), so these tests
are what keeps a field and its row from drifting apart: exactly one row per field and one
field per row, the same default, every default inside its row's bounds, and every bound
refused the same way whether the value came from a flag, a variable or a direct call.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest

from promptcache.contract.front import FRONT_SETTINGS
from promptcache.contract.gateway_policy import GATEWAY_POLICY_SETTINGS
from promptcache.contract.settings import Bounds, Setting, SettingsError, add_flags, collect
from promptcache.front.settings import FrontSettings
from promptcache.gateway.settings import GatewayPolicySettings

TABLES: list[tuple[type[Any], tuple[Setting[Any], ...]]] = [
    (FrontSettings, FRONT_SETTINGS),
    (GatewayPolicySettings, GATEWAY_POLICY_SETTINGS),
]
ROWS = [
    pytest.param(cls, row, id=f"{cls.__name__}.{row.field}")
    for cls, rows in TABLES
    for row in rows
    if row.bounds is not None
]


@pytest.mark.parametrize(("cls", "rows"), TABLES, ids=lambda x: getattr(x, "__name__", ""))
def test_every_field_has_exactly_one_row_with_its_default(
    cls: type[Any], rows: tuple[Setting[Any], ...]
) -> None:
    fields = {f.name: f.default for f in dataclasses.fields(cls)}
    names = [row.field for row in rows]
    assert len(names) == len(set(names)), "a field with two rows"
    assert set(names) == set(fields), "a field without a row, or a row without a field"
    for row in rows:
        assert fields[row.field] == row.default, row.field
    for attr in ("flag", "env"):
        values = [getattr(row, attr) for row in rows]
        assert len(values) == len(set(values)), f"two rows with one {attr}"


@pytest.mark.parametrize(("cls", "rows"), TABLES, ids=lambda x: getattr(x, "__name__", ""))
def test_the_defaults_pass_their_own_rows(cls: type[Any], rows: tuple[Setting[Any], ...]) -> None:
    settings = cls()
    for row in rows:
        assert getattr(settings, row.field) == row.default


def _outside(bounds: Bounds[Any]) -> list[Any]:
    step = 1 if isinstance(bounds.low if bounds.low is not None else bounds.high, int) else 0.5
    values = []
    if bounds.low is not None:
        values.append(bounds.low if bounds.above else bounds.low - step)
    if bounds.high is not None:
        values.append(bounds.high + step)
    return values


@pytest.mark.parametrize(("cls", "row"), ROWS)
def test_a_value_outside_its_bounds_is_refused_naming_the_flag_however_given(
    cls: type[Any], row: Setting[Any]
) -> None:
    assert row.bounds is not None
    rows = dict(TABLES)[cls]
    parser = argparse.ArgumentParser()
    add_flags(parser, rows)
    for value in _outside(row.bounds):
        with pytest.raises(SettingsError) as direct:
            cls(**{row.field: value})
        with pytest.raises(SettingsError) as by_env:
            cls(**collect(rows, parser.parse_args([]), {row.env: str(value)}))
        with pytest.raises(SettingsError) as by_flag:
            cls(**collect(rows, parser.parse_args([row.flag, str(value)]), {}))
        assert str(direct.value).startswith(f"{row.flag}={value!r} must be")
        assert str(direct.value) == str(by_env.value) == str(by_flag.value)


@pytest.mark.parametrize(
    ("bounds", "value", "problem"),
    [
        (Bounds(1), 0, "must be at least 1"),
        (Bounds(1), 1, None),
        (Bounds(0.0, above=True), 0.0, "must be more than 0"),
        (Bounds(0.0, 3600.0), 3600.5, "must be in [0, 3600]"),
        (Bounds(0.0, 3600.0, above=True), 0.0, "must be in (0, 3600]"),
        (Bounds(high=10), 11, "must be at most 10"),
        (Bounds(1, 100), 100, None),
    ],
)
def test_bounds_say_the_range(bounds: Bounds[Any], value: float, problem: str | None) -> None:
    assert bounds.problem(value) == problem
