"""YAML in and out, the same way everywhere: stable key order, readable block strings.

Rendered output is meant to be committed (GitOps), so the same objects must
always give the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):
    """SafeDumper that writes multi-line strings as `|` blocks and never aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_representer)


def dump(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)


def dump_all(objs: Iterable[Any]) -> str:
    return yaml.dump_all(
        list(objs),
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        width=100,
        explicit_start=True,
    )
