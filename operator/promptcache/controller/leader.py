"""Leader election on a coordination.k8s.io Lease, so two replicas never both act.

Why a Lease and not kopf peering: kopf's peering pauses *every* operator when
two share a priority (it is meant for a developer's laptop overriding the
in-cluster operator), needs its own CRDs, and has no per-object lock. A Lease is
what Kubernetes controllers use: one holder, renewed every few seconds; a
standby takes over when the holder has not renewed for `lease_s` seconds as
measured on the standby's own clock (no clock-skew trust), and a holder that
cannot renew in time stops acting before anyone can take over.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from dataclasses import dataclass
from typing import Any

from promptcache.controller.errors import ApiError, ConflictError
from promptcache.controller.kube import Kube, by_kind
from promptcache.controller.options import DEFAULT_LEASE_SECONDS

log = logging.getLogger(__name__)
LEASE = by_kind("Lease")


def _micro_time() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeadershipLostError(RuntimeError):
    """The Lease could not be renewed in time: stop acting now."""


@dataclass
class LeaderElector:
    kube: Kube
    namespace: str
    name: str
    identity: str
    lease_s: int = DEFAULT_LEASE_SECONDS
    renew_s: float = 5.0
    retry_s: float = 2.0

    def __post_init__(self) -> None:
        self._observed: tuple[Any, Any] | None = None
        self._observed_at = 0.0
        self._last_renew = 0.0

    def _manifest(self, current: dict[str, Any] | None, *, acquire: bool) -> dict[str, Any]:
        now = _micro_time()
        spec = dict((current or {}).get("spec") or {})
        if acquire:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (
                1 if current else 0
            )
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=self.lease_s, renewTime=now)
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if current is not None:
            meta["resourceVersion"] = current["metadata"]["resourceVersion"]
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": spec,
        }

    async def try_acquire(self) -> bool:
        """One attempt; True when this replica holds the Lease afterwards."""
        current = await self.kube.get(LEASE, self.namespace, self.name)
        if current is None:
            created = await self.kube.create(self._manifest(None, acquire=True))
            if created is not None:
                self._last_renew = time.monotonic()
            return created is not None
        spec = current.get("spec") or {}
        holder = spec.get("holderIdentity")
        if holder == self.identity:
            return await self._put(current, acquire=False)
        record = (holder, spec.get("renewTime"))
        if record != self._observed:
            self._observed, self._observed_at = record, time.monotonic()
        duration = int(spec.get("leaseDurationSeconds") or self.lease_s)
        if holder and time.monotonic() - self._observed_at < duration:
            return False
        log.info("lease %s/%s: taking over from %r", self.namespace, self.name, holder)
        return await self._put(current, acquire=True)

    async def _put(self, current: dict[str, Any], *, acquire: bool) -> bool:
        try:
            await self.kube.replace(self._manifest(current, acquire=acquire))
        except ConflictError:
            return False
        self._last_renew = time.monotonic()
        return True

    async def acquire(self) -> None:
        """Wait (bounded by cancellation only) until this replica leads."""
        log.info("waiting to lead (lease %s/%s as %s)", self.namespace, self.name, self.identity)
        while True:
            try:
                if await self.try_acquire():
                    log.info("leading (lease %s/%s)", self.namespace, self.name)
                    return
            except (ApiError, OSError) as error:
                log.warning("lease %s/%s: %s", self.namespace, self.name, error)
            await asyncio.sleep(self.retry_s)

    async def hold(self) -> None:
        """Renew until renewal fails for longer than is safe; then raise LeadershipLostError."""
        deadline_s = self.lease_s * 2 / 3
        while True:
            await asyncio.sleep(self.renew_s)
            try:
                current = await self.kube.get(LEASE, self.namespace, self.name)
                holder = ((current or {}).get("spec") or {}).get("holderIdentity")
                if current is None or holder != self.identity:
                    raise LeadershipLostError(f"lease now held by {holder!r}")
                await self._put(current, acquire=False)
            except (ApiError, OSError) as error:
                log.warning("lease renewal failed: %s", error)
            if time.monotonic() - self._last_renew > deadline_s:
                raise LeadershipLostError("could not renew the lease in time")

    async def release(self) -> None:
        """Give the Lease up on a clean exit so a standby takes over at once."""
        try:
            current = await self.kube.get(LEASE, self.namespace, self.name)
            if current and (current.get("spec") or {}).get("holderIdentity") == self.identity:
                manifest = self._manifest(current, acquire=False)
                manifest["spec"]["holderIdentity"] = ""
                manifest["spec"]["leaseDurationSeconds"] = 1
                await self.kube.replace(manifest)
        except (ApiError, OSError) as error:
            log.warning("could not release the lease: %s", error)
