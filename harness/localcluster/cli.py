"""The argument front of `e2e/cluster`: parse a subcommand and hand it to `commands`.

`e2e/cluster` (a launcher) runs this as `python -m harness.localcluster`; the help text is
the launcher's, so `e2e/cluster -h` reads as it always has. Errors the user can act on
(`ClusterError`) print one line, no traceback, and exit 1.
"""

from __future__ import annotations

import argparse

from . import commands
from .errors import ClusterError, say
from .lifecycle import UpOptions
from .state import DEFAULT_NAME, cluster_dir

DESCRIPTION = (
    "Build and run a real, local Kubernetes control plane for promptcache's tests and demo."
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="e2e/cluster", description=DESCRIPTION)
    sub = p.add_subparsers(dest="cmd", required=True)

    def with_target(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--name", default=DEFAULT_NAME, help="cluster name (default: dev)")
        sp.add_argument("--dir", help="cluster state dir (default: $CACHE/clusters/<name>)")

    b = sub.add_parser("build", help="build or reuse all binaries; prints name, version, path")
    b.add_argument("--only", nargs="*", help="only the targets holding these binaries (e.g. epp)")
    b.add_argument(
        "--for-tests",
        action="store_true",
        help="also the on-request binaries the test suite uses (bbr, prometheus, ...)",
    )
    w = sub.add_parser(
        "which", help="print the path of a built binary (or `crds`, `monitoring-crds`)"
    )
    w.add_argument("binary")

    u = sub.add_parser("up", help="start a cluster (idempotent)")
    with_target(u)
    u.add_argument("--nodes", type=int, default=2, help="fake GPU nodes (default 2)")
    u.add_argument("--gpus", type=int, default=8, help="nvidia.com/gpu per node (default 8)")
    u.add_argument(
        "--pods-per-node", type=int, default=110, help="pods a fake node admits (default 110)"
    )
    u.add_argument(
        "--cpus-per-node", type=int, default=64, help="CPU a fake node offers (default 64)"
    )
    u.add_argument("--pod-cidr", help="pod CIDR inside 127.0.0.0/8 (default: random /16)")
    u.add_argument("--no-gateway-crds", action="store_true", help="skip Gateway/InferencePool CRDs")
    u.add_argument("--no-build", action="store_true", help="fail instead of building binaries")
    u.add_argument("--kind", action="store_true", help="use kind (needs docker/podman)")
    u.add_argument("--keep-on-failure", action="store_true", help="leave processes for debugging")
    u.add_argument("--watch-pid", type=int, help="take the cluster down when this pid exits")

    dn = sub.add_parser("down", help="stop a cluster and remove its state")
    with_target(dn)
    dn.add_argument("--keep", action="store_true", help="keep the state dir (logs)")
    st = sub.add_parser("status", help="show a cluster's components")
    with_target(st)
    st.add_argument("--json", action="store_true")
    e = sub.add_parser("env", help="print shell exports (KUBECONFIG, pod CIDR, PATH)")
    with_target(e)
    wt = sub.add_parser("_watch")
    wt.add_argument("--dir", required=True)
    wt.add_argument("--pid", type=int, required=True)
    return p


def dispatch(args: argparse.Namespace) -> int:
    if args.cmd == "build":
        return commands.build(args.only, for_tests=args.for_tests)
    if args.cmd == "which":
        return commands.which(args.binary)
    if args.cmd == "_watch":
        return commands.watch(cluster_dir("", args.dir), args.pid)
    d = cluster_dir(args.name, args.dir)
    if args.cmd == "up":
        opts = UpOptions(
            name=args.name,
            dir=args.dir,
            nodes=args.nodes,
            gpus=args.gpus,
            pods_per_node=args.pods_per_node,
            cpus_per_node=args.cpus_per_node,
            pod_cidr=args.pod_cidr,
            gateway_crds=not args.no_gateway_crds,
            allow_build=not args.no_build,
            kind=args.kind,
            keep_on_failure=args.keep_on_failure,
            watch_pid=args.watch_pid,
        )
        return commands.up(opts, d)
    if args.cmd == "down":
        return commands.down(d, keep=args.keep)
    if args.cmd == "status":
        return commands.status(d, as_json=args.json)
    return commands.env(d)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return dispatch(args)
    except ClusterError as exc:
        say(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        return 130
