"""The pinned build targets: which binaries, from which wrapper module, built when.

The long Kubernetes build goes last. The Endpoint Picker is promptcache's own build
(`picker/`, a module of this repository): GIE v1.5.0's `cmd/epp` runner (the last GIE
release with a picker; the module proxy refuses llm-d-router) with promptcache's plugins
registered. With a config that names none of them it is the upstream picker, so it is also
the `gie-v1.5` picker the e2e picker tests run on (`spec.gateway.picker: gie-v1.5`;
docs/endpoint-picker.md). Its stamp covers its own Go sources (`build.module_sources`).
Cold: about 10 minutes on 2 busy cores; cached afterwards like every other binary.
"""

from __future__ import annotations

import time
from pathlib import Path

from . import crds
from .build import Target, build_lock, build_target, prefetch_modules
from .errors import ClusterError, say

TARGETS: list[Target] = [
    Target(
        "picker",
        "../picker",
        "sigs.k8s.io/gateway-api-inference-extension",
        {"epp": "promptcache.local/picker"},
        control_plane=False,
    ),
    # The body-based router (GIE v1.5.0 `cmd/bbr`, the last GIE release with it), on request
    # (`build --only bbr`): the multi-model tests run it as the Gateway's ext_proc against the
    # local API server, where it reads the adapter-to-base-model ConfigMaps the renderer makes.
    Target(
        "bbr",
        "tools/bbr",
        "sigs.k8s.io/gateway-api-inference-extension",
        {"bbr": "sigs.k8s.io/gateway-api-inference-extension/cmd/bbr"},
        optional=True,
        control_plane=False,
    ),
    Target(
        "kwok",
        "tools/kwok",
        "sigs.k8s.io/kwok",
        {"kwok": "sigs.k8s.io/kwok/cmd/kwok", "kwokctl": "sigs.k8s.io/kwok/cmd/kwokctl"},
    ),
    Target("helm", "tools/helm", "helm.sh/helm/v4", {"helm": "helm.sh/helm/v4/cmd/helm"}),
    Target(
        "etcd", "controlplane", "go.etcd.io/etcd/server/v3", {"etcd": "go.etcd.io/etcd/server/v3"}
    ),
    # Prometheus and promtool, on request (`build --only prometheus`): the alert-rule unit
    # tests (`promtool test rules`) and the dashboard e2e test. `remove_all_sd` leaves out the
    # cloud service-discovery plugins (AWS, Azure, GCE, ...): the tests scrape static and
    # file_sd targets, and the build is a fraction of the full one.
    Target(
        "prometheus",
        "tools/prometheus",
        "github.com/prometheus/prometheus",
        {
            "prometheus": "github.com/prometheus/prometheus/cmd/prometheus",
            "promtool": "github.com/prometheus/prometheus/cmd/promtool",
        },
        optional=True,
        tags="remove_all_sd",
    ),
    # prometheus-adapter, on request (`build --only prometheus-adapter`): the custom metrics
    # API server the autoscaling e2e test registers as an APIService, so the HPA controller
    # reads the model servers' queue length from Prometheus. v0.12.0 is the newest version
    # the module proxy serves; its go.mod has no replace lines.
    Target(
        "prometheus-adapter",
        "tools/prometheus-adapter",
        "sigs.k8s.io/prometheus-adapter",
        {"prometheus-adapter": "sigs.k8s.io/prometheus-adapter/cmd/adapter"},
        optional=True,
    ),
    Target("kind", "tools/kind", "sigs.k8s.io/kind", {"kind": "sigs.k8s.io/kind"}, optional=True),
    # The workflow linter scripts/test runs on .github/workflows; small, so not optional.
    Target(
        "actionlint",
        "tools/actionlint",
        "github.com/rhysd/actionlint",
        {"actionlint": "github.com/rhysd/actionlint/cmd/actionlint"},
    ),
    Target(
        "kubernetes",
        "controlplane",
        "k8s.io/kubernetes",
        {
            "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
            "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
            "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
            "kubectl": "k8s.io/kubernetes/cmd/kubectl",
        },
    ),
]


def find_target(binary: str) -> Target:
    for t in TARGETS:
        if binary in t.binaries:
            return t
    names = sorted(b for t in TARGETS for b in t.binaries)
    raise ClusterError(f"unknown binary {binary!r}; known: {', '.join(names)}")


def binary_path(binary: str) -> Path:
    """Where `binary` is once built (it may not be yet: check `is_file()`)."""
    return find_target(binary).out_dir() / binary


FOR_TESTS = ("bbr", "prometheus", "promtool", "prometheus-adapter")
"""The on-request binaries the test suite uses (through `built_binary`): `build --for-tests`
builds them with the defaults, so scripts/test compiles them in its set-up, beside the
downloads, instead of inside a test's set-up (minutes each when cold). A test checks that
every on-request binary a test uses is listed here."""


def build(only: list[str] | None = None, for_tests: bool = False) -> None:
    """Build (or reuse) the default targets (and with `for_tests` those of `FOR_TESTS`), or
    only those holding the `only` binaries; prints `name<TAB>version<TAB>path` per binary.
    Idempotent, seconds when warm."""
    with build_lock():
        t0 = time.monotonic()
        wanted = {find_target(b).tool for b in FOR_TESTS} if for_tests else set()
        targets = [t for t in TARGETS if not t.optional or t.tool in wanted]
        if only:
            wanted = {find_target(b).tool for b in only}
            targets = [t for t in TARGETS if t.tool in wanted]
        # The first target compiles at once; the others' downloads start beside it.
        pool = prefetch_modules(t for t in targets[1:] if not t.is_current())
        try:
            for i, t in enumerate(targets, 1):
                build_target(t, i, len(targets), t0)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        if not only or "crds" in only:
            crds.crd_dirs()
        say(f"build: all binaries ready in {time.monotonic() - t0:.0f}s")
        for t in targets:
            for b in t.binaries:
                print(f"{b}\t{t.version()}\t{t.out_dir() / b}")


def ensure_binaries(allow_build: bool) -> None:
    """What `up` needs is built, or is built now (unless `allow_build` is false)."""
    missing = [t for t in TARGETS if t.control_plane and not t.optional and not t.is_current()]
    if not missing:
        return
    if not allow_build:
        names = ", ".join(t.tool for t in missing)
        raise ClusterError(f"binaries missing or stale ({names}); run `e2e/cluster build` first")
    build()


def current_bin_dirs() -> list[str]:
    """The built targets' directories, for PATH."""
    return sorted({str(t.out_dir()) for t in TARGETS if t.is_current()})
