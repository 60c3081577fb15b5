"""What `up` started, persisted so `down`/`status`/`env` work from another shell; and the
choices made before starting (ports, pod CIDR) that must not collide with other clusters."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ClusterError
from .paths import CLUSTERS_ROOT
from .ports import SLICES, slice_index

STATE_FILE = "cluster.json"
DEFAULT_NAME = "dev"


@dataclass
class State:
    """One cluster dir's state file (`cluster.json`)."""

    name: str
    dir: str
    pod_cidr: str
    ports: dict[str, int]
    pids: dict[str, int] = field(default_factory=dict)
    gateway_crds: bool = True
    mode: str = "local"  # "local" (processes here) or "kind"
    nodes: list[str] = field(default_factory=list)

    @property
    def kubeconfig(self) -> Path:
        return Path(self.dir) / "kubeconfig"

    def save(self) -> None:
        """Atomically: a reader in another shell never sees half a file."""
        path = Path(self.dir) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.__dict__, indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, d: Path) -> State | None:
        try:
            return cls(**json.loads((d / STATE_FILE).read_text()))
        except FileNotFoundError:
            return None


def cluster_dir(name: str, dir: str | None) -> Path:
    """`--dir` when given, else `$CACHE/clusters/<name>`."""
    if dir:
        return Path(dir).resolve()
    return CLUSTERS_ROOT / name


def pick_pod_cidr(clusters_root: Path = CLUSTERS_ROOT) -> str:
    """A /16 inside 127.0.0.0/8 that no other cluster in the cache uses.

    Loopback pod IPs are the point: on Linux all of 127/8 is bound to `lo`, so a test can
    start an HTTP server on a fake pod's IP and the Endpoint Picker or operator reaches it.
    """
    used: set[str] = set()
    if clusters_root.is_dir():
        for d in clusters_root.iterdir():
            st = State.load(d)
            if st is not None:
                used.add(st.pod_cidr)
    # Each pytest-xdist worker picks from its own second octets (as it picks its own ports),
    # so two workers starting clusters at the same moment cannot both choose one CIDR
    # before either has written its state file.
    mine = [x for x in range(100, 251) if (x - 100) % SLICES == slice_index()]
    free = [f"127.{x}.0.0/16" for x in mine if f"127.{x}.0.0/16" not in used]
    if not free:
        raise ClusterError(f"no free 127.x.0.0/16 pod CIDR left among {len(mine)} of this worker")
    return random.SystemRandom().choice(free)
