"""`promptcache run` takes its defaults from the one place the operator's parts read them."""

from __future__ import annotations

import argparse
from dataclasses import fields

from promptcache.controller.command import register
from promptcache.controller.handlers import HandlerSettings
from promptcache.controller.leader import LeaderElector
from promptcache.controller.options import OperatorOptions, ReconcileSettings

FLAG_OF = {
    "bind_address": "bind_address",
    "health_port": "health_port",
    "metrics_port": "metrics_port",
    "resync_s": "resync_seconds",
    "scrape_port": "scrape_port",
    "scrape_timeout_s": "scrape_timeout",
    "status_window_s": "status_window_seconds",
    "lease_name": "lease_name",
    "lease_s": "lease_seconds",
}


def test_run_flags_default_to_the_operator_options() -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["run", "-A"])
    defaults = OperatorOptions()
    for field, dest in FLAG_OF.items():
        assert getattr(args, dest) == getattr(defaults, field), field


def test_the_parts_default_to_the_same_values() -> None:
    defaults = OperatorOptions()
    assert HandlerSettings().resync_s == defaults.resync_s
    assert ReconcileSettings().scrape_port == defaults.scrape_port
    assert ReconcileSettings().scrape_timeout_s == defaults.scrape_timeout_s
    assert ReconcileSettings().status_window_s == defaults.status_window_s
    lease = {f.name: f.default for f in fields(LeaderElector)}
    assert lease["lease_s"] == defaults.lease_s
