"""The harness's kubelet never leaves an engine running that nobody will stop.

A pod left running holds an engine slot (and its port) for the rest of the session; the
next test that needs engines then waits for a slot that never frees. These are the two
ways one was left: a pod whose start failed inside `with`, and a pod stopped while its
start was still waiting for a slot.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import harness.engine.cluster_pods as cluster_pods
import harness.pod
import harness.vllm.slots as slots
from harness.localcluster.lifecycle import PROCESS_POD_ANNOTATION
from harness.pod import VLLM_CONTAINER, ProcessPod, running_pods
from harness.waiting import wait_until


def _spec(name: str, **extra: Any) -> dict[str, Any]:
    return {"containers": [{"name": name, "args": [], **extra}]}


def _no_secrets(name: str, key: str) -> bytes:
    raise AssertionError(f"no Secret is read here ({name}/{key})")


def test_a_pod_whose_start_fails_inside_with_is_stopped(tmp_path: Path) -> None:
    sleeper = (sys.executable, "-c", "import time; time.sleep(120)")
    pod = ProcessPod(
        "failing", _spec("front"), "127.0.0.9", tmp_path, _no_secrets, promptcache_argv=sleeper
    )

    def never_ready(timeout_s: float = 0) -> ProcessPod:
        assert pod.container("front").running(), "the container was started"
        raise TimeoutError("not Ready")

    pod.wait_ready = never_ready  # type: ignore[method-assign]
    with pytest.raises(TimeoutError), pod:
        pass
    proc = pod.container("front").proc
    assert proc is not None
    assert proc.poll() is not None
    assert pod not in running_pods()


def test_a_pod_stopped_while_it_waits_for_a_slot_never_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slots, "SLOT_DIR", tmp_path / "slots")
    monkeypatch.setenv(slots.MAX_ENGINES_ENV, "1")
    # never run; not through PROMPTCACHE_ENGINE_DIR, which `engine_dir` reads once a session
    monkeypatch.setattr(harness.pod, "engine_dir", lambda: tmp_path / "no-engine")
    pod = ProcessPod("waiting", _spec(VLLM_CONTAINER), "127.0.0.10", tmp_path / "pod", _no_secrets)
    errors: list[BaseException] = []

    def start() -> None:
        try:
            pod.start()
        except BaseException as e:
            errors.append(e)

    with slots.engine_slot("the test holds the only slot"):
        starter = threading.Thread(target=start)
        starter.start()
        pod.stop()  # before or while start waits: either way it must not start
    starter.join(timeout=30)
    assert not starter.is_alive()
    assert not errors
    assert all(c.proc is None for c in pod.containers)
    assert pod not in running_pods()
    with slots.engine_slot("the slot is free again", timeout_s=5):
        pass


class _ListsOnePod:
    """A cluster whose one annotated pod has an IP: what the kubelet's loop lists (through
    `pods_json`, as `Cluster` reads it in-process) and any other read returns."""

    def pods_json(self, namespace: str, selector: str) -> dict[str, Any]:
        pod = {
            "metadata": {"name": "alpha-1", "annotations": {PROCESS_POD_ANNOTATION: "true"}},
            "spec": _spec("front"),
            "status": {"podIP": "127.0.0.11"},
        }
        return {"items": [pod]}

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, 0, json.dumps(self.pods_json("", "")), "")


def test_the_kubelet_starts_a_pod_once_however_long_building_it_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Building a pod reads its Secrets with kubectl; ticks that came meanwhile started a
    twin on the same IP, and only the last one built was ever stopped."""
    built: list[str] = []
    building_done = threading.Event()

    class SlowToBuild:
        def __init__(self, name: str, *args: Any, **kwargs: Any) -> None:
            built.append(name)
            building_done.wait(timeout=2.0)  # many loop periods
            self.name, self.ready = name, False

        def start(self) -> SlowToBuild:
            return self

        def stop(self) -> None:
            pass

    monkeypatch.setattr(cluster_pods, "ProcessPod", SlowToBuild)
    kubelet = cluster_pods.ProcessKubelet(
        _ListsOnePod(),  # type: ignore[arg-type]
        "ns",
        "app=alpha",
        tmp_path,
        period_s=0.05,
        say=lambda _: None,
    )
    with kubelet:
        wait_until(lambda: list(built), "the kubelet building the first pod", within_s=30,
                   interval_s=0.01)  # fmt: skip
        time.sleep(0.5)  # ten more ticks while the first pod is still being built
        building_done.set()
        time.sleep(0.2)
    assert built == ["alpha-1"]


def test_a_restart_by_liveness_is_logged_with_what_the_probe_said(tmp_path: Path) -> None:
    """A restart mid-test must be explainable from the pod's files alone: the event log
    names the container, the probe, how often it failed and how its last run ended."""
    sleeper = (sys.executable, "-c", "import time; time.sleep(120)")
    liveness = {
        "exec": {"command": ["python3", "-c", "import sys; sys.exit('engine wedged')"]},
        "periodSeconds": 1,
        "failureThreshold": 2,
        "timeoutSeconds": 10,
    }
    pod = ProcessPod(
        "wedged",
        _spec("front", livenessProbe=liveness),
        "127.0.0.9",
        tmp_path,
        _no_secrets,
        promptcache_argv=sleeper,
    )
    events = tmp_path / "kubelet.log"
    with pod:
        wait_until(
            lambda: pod.container("front").restarts,
            "a restart of front by its liveness probe (restarts)",
            within_s=60,
            interval_s=0.1,
            detail=lambda: f"events: {_read(events)}",
        )
    logged = _read(events)
    assert "front: liveness probe failed: exit 1: engine wedged after" in logged, logged
    assert (
        "front: restarting it, its liveness probe failed 2 times in a row "
        "(the last: exit 1: engine wedged after"
    ) in logged, logged


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else "(no event log)"
