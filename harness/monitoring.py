"""The real Prometheus for tests: the pinned binary, a scrape config, the chart's queries.

Shared by the dashboard test on stand-in pods (`e2e/test_monitoring_dashboard.py`) and the
one on the real engine (`e2e/engine/test_engine_monitoring.py`).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from harness.net import free_port
from harness.pytest_cluster import built_binary
from harness.waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]
FILES = ROOT / "charts" / "promptcache-operator" / "files"
DASHBOARD = FILES / "dashboards" / "promptcache.json"
RULES = FILES / "prometheus-rules.yaml"


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel."""
    doc = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in doc["panels"] for t in p["targets"]]


def recorded_names() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r]


def target_labels(pod: dict[str, Any], relabelings: list[dict[str, Any]]) -> dict[str, str]:
    """What the Prometheus Operator makes of a PodMonitor for this pod: `namespace` and
    `pod`, plus the PodMonitor's relabelings from `__meta_kubernetes_pod_label_*`."""
    meta = {
        "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", k): v
        for k, v in pod["metadata"]["labels"].items()
    }
    labels = {"namespace": pod["metadata"]["namespace"], "pod": pod["metadata"]["name"]}
    for r in relabelings:
        (source,) = r["sourceLabels"]
        labels[r["targetLabel"]] = meta[source]
    return labels


class Prometheus:
    def __init__(self, workdir: Path, scrape_configs: list[dict[str, Any]]) -> None:
        self.port = free_port()
        self.workdir = workdir
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": scrape_configs,
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (workdir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                str(built_binary("prometheus")),
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.loads(resp.read())["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.api("query", query=expr)["result"])

    def wait_up(self, timeout_s: float = 60) -> None:
        wait_until(
            lambda: {t["scrapeUrl"]: t["health"] for t in self.api("targets")["activeTargets"]},
            "every Prometheus target up",
            within_s=timeout_s,
            interval_s=0.5,
            until=lambda health: bool(health) and set(health.values()) == {"up"},
            retry_on=(OSError,),
            detail=lambda: f"Prometheus's log tail:\n{self.log_tail()}",
        )

    def log_tail(self) -> str:
        return "\n".join((self.workdir / "prometheus.log").read_text().splitlines()[-30:])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def finite(results: list[dict[str, Any]]) -> list[float]:
    values = [float(r["value"][1]) for r in results]
    return [v for v in values if math.isfinite(v)]
