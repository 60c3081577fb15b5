"""The local Kubernetes control plane of `e2e/cluster`, as modules with one job each.

Why a package: the command line stays a thin argparse front (`cli`, which the `e2e/cluster`
launcher runs as `python -m harness.localcluster`), and each part can be tested on its own
(`e2e/test_localcluster_*.py`) with the real tools it drives (go, openssl, kubectl, child
processes). Why in the harness: it is where tests, benches and the demo get their clusters
from. Python stdlib only (`harness/__init__.py` too) and no import of promptcache: the
control plane must build and start before the project is installed (`scripts/test` builds
with the system `python3` before any venv exists).

- `paths`       where binaries, Go caches and cluster dirs live
- `errors`      the errors a user reads (no traceback) and the progress line
- `build`       Go build targets: go.mod versions, build stamps, `go build` under a lock
- `targets`     the pinned targets (which binaries, from which wrapper module)
- `crds`        the pinned CRD files (from Go modules) and waiting for a CRD to be Established
- `pki`         the cluster's CA and certificates, made with openssl
- `kubeconfig`  the admin kubeconfig
- `supervise`   child process groups: start with a log, early-exit detection, grace → kill
- `state`       the persisted cluster state, its ports and its pod CIDR
- `lifecycle`   `up` and `down`, composed from the parts above
- `commands`    what each subcommand of `e2e/cluster` does
- `cli`         the arguments of `e2e/cluster` (`__main__` runs it)
"""
