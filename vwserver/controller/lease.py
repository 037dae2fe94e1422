"""Leader election on a ``coordination.k8s.io/v1`` Lease in a kcp workspace (issue #4 §5).

Every replica serves every slice; only the leader writes slice status, so replicas never fight
over it. The algorithm is client-go's: a replica takes the lease when it is free or when its
record has not changed for ``leaseDurationSeconds`` *as observed by this replica's own clock*
(no trust in other machines' clocks), renews it every ``renew_interval``, and updates it with
optimistic concurrency (resourceVersion), so two replicas can never both believe they won the
same round. Losing the lease (or failing to renew in time) stops status writes, never serving.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from vwserver.errors import UpstreamUnavailable
from vwserver.k8s.client import JSON, ApiError, KubeClient

log = logging.getLogger(__name__)


def micro_time(now: datetime) -> str:
    """``metav1.MicroTime`` as the apiserver writes it."""
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        *,
        client: KubeClient,
        workspace: str,
        name: str,
        identity: str,
        lease_seconds: int = 15,
        renew_interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        self._client = client
        self._path = (
            f"/clusters/{workspace}/apis/coordination.k8s.io/v1/namespaces/default/leases/{name}"
        )
        self._collection = self._path.rsplit("/", 1)[0]
        self._name = name
        self.identity = identity
        self._lease_seconds = lease_seconds
        self._renew_interval = renew_interval
        self._clock = clock
        self._wall = wall
        self._sleep = sleep
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._renewed_at: float | None = None

    @property
    def is_leader(self) -> bool:
        """True only while our last successful renewal is younger than the lease duration."""
        return self._renewed_at is not None and (
            self._clock() - self._renewed_at < self._lease_seconds
        )

    async def run(self) -> None:
        while True:
            try:
                await self.try_acquire_or_renew()
            except (ApiError, UpstreamUnavailable) as e:
                log.warning("lease %s: %s", self._name, e)
            await self._sleep(self._renew_interval)

    async def try_acquire_or_renew(self) -> bool:
        """One round; whether we hold the lease afterwards."""
        now_wall = micro_time(self._wall())
        lease = await self._client.get(self._path)
        if lease is None:
            await self._client.request("POST", self._collection, body=self._lease(None, now_wall))
            return self._won(now_wall)
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, str(spec.get("renewTime") or ""))
        if record != self._observed:
            self._observed, self._observed_at = record, self._clock()
        expired = self._clock() - self._observed_at >= int(
            spec.get("leaseDurationSeconds") or self._lease_seconds
        )
        if holder and holder != self.identity and not expired:
            self._renewed_at = None
            return False
        try:
            await self._client.request("PUT", self._path, body=self._lease(lease, now_wall))
        except ApiError as e:
            if e.code == 409:  # someone else updated it first: they won this round
                self._renewed_at = None
                return False
            raise
        return self._won(now_wall)

    def _won(self, renew_time: str) -> bool:
        if not self.is_leader:
            log.info("lease %s: %s is now the leader", self._name, self.identity)
        self._renewed_at = self._clock()
        self._observed, self._observed_at = (self.identity, renew_time), self._clock()
        return True

    def _lease(self, current: JSON | None, now: str) -> JSON:
        spec = dict((current or {}).get("spec") or {})
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (
                1 if current else 0
            )
        spec.update(
            holderIdentity=self.identity, leaseDurationSeconds=self._lease_seconds, renewTime=now
        )
        metadata: JSON = {"name": self._name, "namespace": "default"}
        if current is not None:
            metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }
