"""The sub-commands containers run are the CLI's: one name each, in `contract.Command`."""

from __future__ import annotations

import argparse

from promptcache.cli import build_parser
from promptcache.contract import Command


def test_every_command_a_container_runs_is_a_sub_command() -> None:
    (sub,) = (a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert {c.value for c in Command} <= set(sub.choices)
