"""The same rendered config on the real EPP, with pods listed in a file instead of a cluster.

llm-d-router's `file-discovery` plugin lets the EPP run without Kubernetes: it
reads the endpoints from a file. The benchmark uses it by default so it runs
in seconds without starting a control plane; the routing plugins, their
parameters and the EPP binary are exactly the rendered ones, only the way the
EPP learns the pod list differs. (`bench/epp_routing.py --cluster` uses the
local control plane instead, like the tests.)
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from .binary import find_epp_binary, missing_reason
from .fake_pod import FakePod, VllmMetrics
from .process import EppProcess
from .rendered import Rendered

DISCOVERY = "file-discovery"


def with_file_discovery(config: dict[str, Any], endpoints_file: Path) -> dict[str, Any]:
    """The rendered config plus a file-discovery plugin that the data layer uses."""
    out = copy.deepcopy(config)
    out["plugins"].append(
        {"name": DISCOVERY, "type": DISCOVERY, "parameters": {"path": str(endpoints_file)}}
    )
    out.setdefault("dataLayer", {})["discovery"] = {"pluginRef": DISCOVERY}
    return out


class FilePool:
    """N stand-in pods on 127.0.<net>.<i> and the EPP with the rendered config."""

    def __init__(
        self,
        rendered: Rendered,
        workdir: Path,
        pods: int,
        metrics: Callable[[int], VllmMetrics] = lambda i: VllmMetrics(),
        net: int = 77,
    ) -> None:
        self.rendered = rendered
        self.workdir = workdir
        port = rendered.target_port
        self.pods = [
            FakePod(f"pod-{i}", f"127.0.{net}.{i + 1}", port, metrics(i)) for i in range(pods)
        ]
        self.epp: EppProcess | None = None

    def start(self) -> FilePool:
        binary = find_epp_binary()
        if binary is None:
            raise RuntimeError(missing_reason())
        for p in self.pods:
            p.start()
        endpoints = {
            "endpoints": [
                {"name": p.name, "namespace": "bench", "address": p.ip, "port": str(p.port)}
                for p in self.pods
            ]
        }
        endpoints_file = self.workdir / "endpoints.yaml"
        endpoints_file.write_text(yaml.safe_dump(endpoints))
        config = with_file_discovery(self.rendered.epp_config, endpoints_file)
        pool_flags = ("--pool-name", "--pool-namespace", "--pool-group")
        args = [a for a in self.rendered.epp_args]
        cleaned: list[str] = []
        skip_next = False
        for a in args:
            if skip_next:
                skip_next = False
                continue
            if a in pool_flags:
                skip_next = True
                continue
            if a.split("=", 1)[0] in pool_flags:
                continue
            cleaned.append(a)
        cleaned += [
            "--endpoint-selector=app=promptcache-bench",
            f"--endpoint-target-ports={self.rendered.target_port}",
        ]
        self.epp = EppProcess(
            binary, json.dumps(config), self.workdir, pool_name=None, extra_args=cleaned
        )
        self.epp.start()
        self.epp.wait_ready()
        self.epp.wait_scraped({p.name: float(p.snapshot().waiting or 0) for p in self.pods})
        return self

    def close(self) -> None:
        if self.epp is not None:
            self.epp.stop()
        for p in self.pods:
            p.stop()

    def __enter__(self) -> FilePool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
