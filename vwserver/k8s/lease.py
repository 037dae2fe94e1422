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

The Lease's server may be down when a candidate starts or for longer than ``renewDeadline``
while it leads (for the syncer: the downstream cluster). Neither ends the candidate: it steps
down (leading) and campaigns again, retrying with backoff and jitter, and says why in
:attr:`LeaderElector.last_error` — a namespace that does not exist yet is created on the way.

:func:`decide` is the pure core; :class:`LeaderElector` does the I/O through an injectable clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vwserver.clock import Clock, micro_time
from vwserver.errors import ApiConflict, ApiError, ApiNotFound, UpstreamUnavailable
from vwserver.k8s.backoff import Backoff
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


JITTER_FACTOR = 1.2
"""client-go's ``JitterUntil`` factor for candidates: each wait for a lease someone else holds is
``retryPeriod * (1 + 1.2 * rand)``, so that replicas started together do not poll together."""


class LeaderElector:
    """One candidate for one Lease. :meth:`acquire` and :meth:`hold` never fail: every problem
    with the Lease's server (unreachable, 5xx, RBAC) is retried — with :class:`Backoff` and jitter
    while it lasts — and kept in :attr:`last_error` for readiness; the log gets one line per
    change of state, not one per retry."""

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
        backoff: Backoff | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        """``backoff``: the waits after failed attempts (default: from ``retry_period`` up to
        30 s, with jitter); ``rand``: the jitter's source (for tests)."""
        self.identity = identity
        self.is_leader = False
        self.holder: str | None = None
        """The holder of the lease as last read ("" when free, None before the first read)."""
        self.last_error: str | None = None
        """Why the last attempt to read or write the lease failed; None when it worked."""
        self.reachable = True
        """False while the last failure was no answer at all (connection refused, timeout)."""
        self._client = client
        self._base = base
        self._namespace = namespace
        self._name = name
        self._clock = clock
        self._lease_duration = lease_duration
        self._renew_deadline = renew_deadline
        self._retry_period = retry_period
        self._backoff = backoff or Backoff(
            initial=retry_period, maximum=max(30.0, retry_period), jitter=0.5, rand=rand
        )
        self._rand = rand
        self._observed: Observed | None = None
        self._url = LEASES.item(base, namespace, name)
        self._logged_state: str | None = None

    @property
    def lease(self) -> str:
        """``namespace/name`` of the Lease, for messages."""
        return f"{self._namespace}/{self._name}"

    async def acquire(self) -> None:
        """Return once this replica holds the lease. Failures are retried with backoff (and
        jitter) for as long as they last; a lease held by someone else is re-read every
        ``retryPeriod`` (with client-go's jitter). The namespace is created when missing."""
        failures = 0
        while True:
            # Each attempt is bounded: a server that accepts connections but never answers
            # must not stall the candidate past its own deadlines.
            if await self._try(within=self._renew_deadline):
                break
            if self.last_error is not None:
                failures += 1
                delay = self._backoff.delay(failures)
            else:  # someone else holds it, or won the race for it
                failures = 0
                delay = self._retry_period * (1 + JITTER_FACTOR * self._rand())
            await self._clock.sleep(delay)
        self.is_leader = True
        log.info("leader election: %s acquired lease %s", self.identity, self.lease)

    async def hold(self) -> None:
        """Renew until that fails for ``renewDeadline``; then return (leadership lost).

        Each renewal is cut off at the deadline (client-go bounds its retries by the renew
        deadline too): a request hanging on a dead connection must not keep us leading after
        another replica may have taken over (``leaseDuration`` > ``renewDeadline``)."""
        last_renew = self._clock.monotonic()
        while True:
            await self._clock.sleep(self._retry_period)
            remaining = last_renew + self._renew_deadline - self._clock.monotonic()
            if remaining > 0 and await self._try(within=remaining):
                last_renew = self._clock.monotonic()
            elif self._clock.monotonic() - last_renew >= self._renew_deadline:
                self.is_leader = False
                log.warning(
                    "leader election: %s could not renew lease %s for %.0fs; stepping down%s",
                    self.identity,
                    self.lease,
                    self._renew_deadline,
                    f" ({self.last_error})" if self.last_error else "",
                )
                return

    async def release(self) -> None:
        """Give the lease up if we hold it (graceful shutdown); bounded by ``renewDeadline``
        (an unreachable server: the lease simply expires)."""
        if not self.is_leader:
            return
        self.is_leader = False
        try:
            async with asyncio.timeout(self._renew_deadline):
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
        except (ApiError, UpstreamUnavailable, TimeoutError) as e:
            log.warning("leader election: release failed (expires by itself): %s", e or "timeout")

    async def _try(self, *, within: float) -> bool:
        """One tryAcquireOrRenew within ``within`` seconds: True when we hold the lease now.
        False when someone else holds it or won the race (:attr:`last_error` None), or on a
        failure (:attr:`last_error` says which)."""
        try:
            async with asyncio.timeout(within):
                won = await self._try_once()
        except ApiConflict:
            won = False  # another candidate won this round
        except TimeoutError:
            self._failed(f"no answer within {within:.1f}s", reachable=False)
            return False
        except UpstreamUnavailable as e:
            self._failed(str(e), reachable=False)
            return False
        except ApiError as e:
            self._failed(str(e), reachable=True)
            return False
        self._succeeded()
        return won

    async def _try_once(self) -> bool:
        lease = await self._client.get(self._url)
        spec = None if lease is None else dict(lease.get("spec") or {})
        self._observe(spec)
        self._seen_holder(str((spec or {}).get("holderIdentity") or ""))
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
            collection = LEASES.collection(self._base, self._namespace)
            try:
                written = await self._client.request("POST", collection, body=body)
            except ApiNotFound:
                # POST into a namespace that does not exist answers 404: create it (once it
                # exists this is never asked again) and write the lease.
                await self._create_namespace()
                written = await self._client.request("POST", collection, body=body)
        else:
            lease["spec"] = desired  # metadata.resourceVersion makes the PUT conditional
            written = await self._client.request("PUT", self._url, body=lease)
        self._observe(dict(written.get("spec") or {}))
        self.holder = self.identity
        return True

    def _observe(self, spec: dict[str, Any] | None) -> None:
        if spec is None:
            self._observed = None
        elif self._observed is None or self._observed.spec != spec:
            self._observed = Observed(spec=spec, at=self._clock.monotonic())

    def _seen_holder(self, holder: str) -> None:
        if holder != self.holder and holder and holder != self.identity:
            log.info("leader election: lease %s is held by %s", self.lease, holder)
        self.holder = holder

    def _failed(self, error: str, *, reachable: bool) -> None:
        self.last_error, self.reachable = error, reachable
        state = "unreachable" if not reachable else error.split(" from ", 1)[0]
        if state != self._logged_state:  # one line per change of state, not per retry
            self._logged_state = state
            log.warning("leader election: lease %s: %s (retrying with backoff)", self.lease, error)

    def _succeeded(self) -> None:
        if self._logged_state is not None:
            log.info("leader election: lease %s reachable again", self.lease)
            self._logged_state = None
        self.last_error, self.reachable = None, True

    async def _create_namespace(self) -> None:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self._namespace}}
        with contextlib.suppress(ApiConflict):  # created meanwhile
            await self._client.request("POST", NAMESPACES.collection(self._base), body=body)
        log.info("leader election: created namespace %s", self._namespace)
