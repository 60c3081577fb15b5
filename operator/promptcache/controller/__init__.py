"""The operator: all Kubernetes I/O of promptcache (apply, status, events, metrics scraping).

Layers, each in its own module:

- `kube`       dict-in/dict-out REST calls over lightkube's connection handling, counted;
- `compare`    is a rendered child already live? (pure; the zero-writes-on-resync rule);
- `children`   ownerReferences and the rendered-hash annotation (pure);
- `conditions`, `status`  the status and its conditions (pure);
- `checks`, `salt`, `scrape`  realisability checks, the generated salt Secret, pod metrics;
- `reconcile`  one reconcile of one resource, used by every trigger;
- `handlers`   kopf handlers in a registry built at start-up;
- `leader`, `server`, `main`, `command`  running it: Lease, probes/metrics, `promptcache run`.
"""

from __future__ import annotations

__all__: list[str] = []
