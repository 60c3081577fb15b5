"""One call that stands up a rendered example on the cluster with the real EPP in front.

Tests and the benchmark share it so both exercise the same path: render through
the CLI, apply to a namespace of the real API server, bind stand-in pods on the
kwok pod IPs (optionally behind the real cache front), and start the EPP with
the rendered config and flags as the rendered ServiceAccount.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from promptcache.contract import PickerTarget

from .fake_pod import VllmMetrics
from .pool import ClusterLike, PoolOnCluster
from .rendered import EXAMPLES, Rendered, deep_merge, load_example, render_resource


def shape_patch(with_front: bool) -> dict[str, Any]:
    """Spec changes for a pod without the cache front: what needs the front goes too."""
    if with_front:
        return {"front": {"enabled": True}}
    return {
        "front": {"enabled": False, "usageHeaders": {"enabled": False}},
        # no salts without the front's pods either: isolation by account goes with them
        "isolation": {"mode": "Shared", "identity": None},
        "promptEmbeds": {"enabled": False, "cacheGiB": 0},
    }


def routing_patch(
    replicas: int = 4, with_front: bool = False, session: bool = False
) -> dict[str, Any]:
    """Spec changes for routing tests: N replicas, the chosen pod shape, sessions on/off."""
    patch: dict[str, Any] = {"model": {"replicas": replicas}, **shape_patch(with_front)}
    if session:
        patch["sessionAffinity"] = {"enabled": True}
    return patch


class Launcher:
    """Creates pools in one namespace for one picker target and stops them all at the end.

    Every resource it renders names `spec.gateway.picker` (unless the patch does), so the
    config and args are the ones the rendered Deployment gives that picker's binary."""

    def __init__(
        self,
        cluster: ClusterLike,
        namespace: str,
        workdir: Path,
        picker: PickerTarget = PickerTarget.GIE,
    ) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.workdir = workdir
        self.picker = picker
        self.pools: list[PoolOnCluster] = []

    def render(
        self, example: str | Path = "minimal.yaml", spec_patch: Mapping[str, Any] | None = None
    ) -> Rendered:
        path = example if isinstance(example, Path) else EXAMPLES / example
        doc = load_example(path, self.namespace, {"gateway": {"picker": self.picker.value}})
        # Merged into the resource itself, so the patch's removals (`None`) remove.
        deep_merge(doc["spec"], spec_patch or {})
        return Rendered(render_resource(doc))

    def __call__(
        self,
        example: str | Path = "minimal.yaml",
        spec_patch: Mapping[str, Any] | None = None,
        metrics: Callable[[int], VllmMetrics] | None = None,
        start_epp: bool = True,
        config_text: str | None = None,
        extra_args: Sequence[str] = (),
        apply: bool = True,
    ) -> PoolOnCluster:
        rendered = self.render(example, spec_patch)
        workdir = self.workdir / f"pool-{len(self.pools)}"
        workdir.mkdir(parents=True, exist_ok=True)
        pool = PoolOnCluster(self.cluster, rendered, workdir, metrics or (lambda i: VllmMetrics()))
        self.pools.append(pool)
        if apply:
            pool.apply()
            pool.start_pods(with_front=rendered.has_front)
        if start_epp:
            pool.start_epp(config_text=config_text, extra_args=extra_args)
        return pool

    def close(self) -> None:
        for pool in self.pools:
            pool.close()
