"""Leader election with a ``coordination.k8s.io/v1`` Lease, following client-go's algorithm.

Several replicas of one syncer may run (for availability); exactly one may write, or two would
race on finalizers and applies. The Lease lives in the downstream cluster by default — the one
cluster every replica of a syncer reaches, whatever slice it reads.

client-go's rules, kept because they are what makes it safe without synchronized clocks:

* A lease held by another identity may be taken only when its record has **not changed for
  ``leaseDuration`` on our own clock** (we time the observation, never compare our clock with the
  holder's ``renewTime``).
* Every write is a PUT conditional on the resourceVersion read: two candidates cannot both win.
* The holder renews every ``retryPeriod``; if it cannot renew for ``renewDeadline``
  (< ``leaseDuration``) it stops leading *before* anyone else may take over.
* On graceful shutdown the holder releases the lease (empty holder, duration 1 s), so the next
  replica takes over at once instead of after ``leaseDuration``.

:func:`decide` is the pure core; :class:`LeaderElector` does the I/O through an injectable clock.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from typing import Any

from vwserver.clock import Clock, micro_time
from vwserver.errors import ApiConflict, ApiError, UpstreamUnavailable
from vwserver.k8s.client import JSON, KubeClient
from vwserver.k8s.resources import LEASES, NAMESPACES

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Observed:
    """A lease record as last seen, and when (our monotonic clock) it last changed."""

    spec: dict[str, Any]
    at: float


def decide(
    spec: dict[str, Any] | None,
    *,
    identity: str,
    observed: Observed | None,
    now_mono: float,
    now_wall: str,
    lease_duration: float,
) -> dict[str, Any] | None:
    """The spec to write to take or keep the lease, or None while someone else holds it.

    ``observed`` must already reflect ``spec`` (see :meth:`LeaderElector._observe`).
    """
    duration = math.ceil(lease_duration)
    if spec is None:
        return {
            "holderIdentity": identity,
            "leaseDurationSeconds": duration,
            "acquireTime": now_wall,
            "renewTime": now_wall,
            "leaseTransitions": 0,
        }
    holder = spec.get("holderIdentity") or ""
    if holder and holder != identity:
        held_for = float(spec.get("leaseDurationSeconds") or lease_duration)
        if observed is None or observed.at + held_for > now_mono:
            return None
    transitions = int(spec.get("leaseTransitions") or 0)
    if holder == identity:
        acquire_time = spec.get("acquireTime") or now_wall
    else:
        acquire_time, transitions = now_wall, transitions + 1
    return {
        "holderIdentity": identity,
        "leaseDurationSeconds": duration,
        "acquireTime": acquire_time,
        "renewTime": now_wall,
        "leaseTransitions": transitions,
    }


class LeaderElector:
    def __init__(
        self,
        *,
        client: KubeClient,
        base: str,
        namespace: str,
        name: str,
        identity: str,
        clock: Clock,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
    ) -> None:
        self.identity = identity
        self.is_leader = False
        self._client = client
        self._base = base
        self._namespace = namespace
        self._name = name
        self._clock = clock
        self._lease_duration = lease_duration
        self._renew_deadline = renew_deadline
        self._retry_period = retry_period
        self._observed: Observed | None = None
        self._url = LEASES.item(base, namespace, name)

    async def acquire(self) -> None:
        """Return once this replica holds the lease (retrying every ``retryPeriod``)."""
        await self._ensure_namespace()
        while not await self._try():
            await self._clock.sleep(self._retry_period)
        self.is_leader = True
        log.info(
            "leader election: %s acquired lease %s/%s", self.identity, self._namespace, self._name
        )

    async def hold(self) -> None:
        """Renew until that fails for ``renewDeadline``; then return (leadership lost)."""
        last_renew = self._clock.monotonic()
        while True:
            await self._clock.sleep(self._retry_period)
            if await self._try():
                last_renew = self._clock.monotonic()
            elif self._clock.monotonic() - last_renew >= self._renew_deadline:
                self.is_leader = False
                log.warning(
                    "leader election: %s could not renew lease %s/%s for %.0fs; stepping down",
                    self.identity,
                    self._namespace,
                    self._name,
                    self._renew_deadline,
                )
                return

    async def release(self) -> None:
        """Give the lease up if we hold it (graceful shutdown)."""
        if not self.is_leader:
            return
        self.is_leader = False
        try:
            lease = await self._client.get(self._url)
            if lease is None:
                return
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            now = micro_time(self._clock.now())
            lease["spec"] = {
                **spec,
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "renewTime": now,
                "acquireTime": now,
            }
            await self._client.request("PUT", self._url, body=lease)
            log.info("leader election: %s released lease", self.identity)
        except (ApiError, UpstreamUnavailable) as e:
            log.warning("leader election: release failed (expires by itself): %s", e)

    async def _try(self) -> bool:
        """One tryAcquireOrRenew; False on any failure (logged)."""
        try:
            lease = await self._client.get(self._url)
            spec = None if lease is None else dict(lease.get("spec") or {})
            self._observe(spec)
            desired = decide(
                spec,
                identity=self.identity,
                observed=self._observed,
                now_mono=self._clock.monotonic(),
                now_wall=micro_time(self._clock.now()),
                lease_duration=self._lease_duration,
            )
            if desired is None:
                return False
            if lease is None:
                body: JSON = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self._name, "namespace": self._namespace},
                    "spec": desired,
                }
                written = await self._client.request(
                    "POST", LEASES.collection(self._base, self._namespace), body=body
                )
            else:
                lease["spec"] = desired  # metadata.resourceVersion makes the PUT conditional
                written = await self._client.request("PUT", self._url, body=lease)
            self._observe(dict(written.get("spec") or {}))
            return True
        except ApiConflict:
            return False  # another candidate won this round
        except (ApiError, UpstreamUnavailable) as e:
            log.warning("leader election: %s", e)
            return False

    def _observe(self, spec: dict[str, Any] | None) -> None:
        if spec is None:
            self._observed = None
        elif self._observed is None or self._observed.spec != spec:
            self._observed = Observed(spec=spec, at=self._clock.monotonic())

    async def _ensure_namespace(self) -> None:
        url = NAMESPACES.item(self._base, None, self._namespace)
        if await self._client.get(url) is not None:
            return
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self._namespace}}
        with contextlib.suppress(ApiConflict):  # created meanwhile
            await self._client.request("POST", NAMESPACES.collection(self._base), body=body)
