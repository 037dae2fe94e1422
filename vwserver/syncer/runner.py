"""One syncer process: clients, health server, startup checks, leader election, endpoints and
controllers.

:meth:`Syncer.run` is what ``vwserver sync`` runs and what the e2e tests run in-process:

1. open one client for kcp (``upstream``: the endpoint slice lookup), one for the endpoint URLs
   (``endpoints``, default: the same connection) and one for the downstream cluster
   (kubeconfigs — exec plugins included — or the pod's ServiceAccount, ``inCluster``:
   :mod:`vwserver.k8s.kubeconfig`);
2. serve ``/healthz`` ``/readyz`` ``/metrics`` (:mod:`vwserver.health`, as ``serve`` does);
3. check the downstream types against the downstream cluster's discovery
   (:mod:`vwserver.syncer.checks`);
4. with leader election: wait for the Lease, then lead until ``stop`` is set or the lease is
   lost (then controllers stop at once and the replica campaigns again);
5. while leading: resolve the upstream endpoint URLs (static, or re-read from the endpoint slice
   every ``refreshSeconds``), check each new one's discovery, and run one
   :class:`ResourceController` per resource.

**Outages do not end the process.** The downstream cluster (or kcp) may be unreachable when the
syncer starts, or go away while it leads for longer than the renew deadline. Every phase
retries with backoff and jitter until ``stop``: the startup checks, the Lease (the elector
retries by itself, and a lost lease means campaigning again), the reflectors and work queues.
``/readyz`` says what it is waiting for (``downstream unreachable: …``, ``checking upstream
discovery at …``, an informer that has not listed); the log gets one warning when a state
begins and one line when it ends, not one per retry. What does end it: a configuration the
servers definitely contradict (a resource they do not serve: :class:`ConfigError`, exit 2) and
bugs.

Graceful shutdown (``stop`` set, e.g. SIGTERM): workers are cancelled (an interrupted step is
redone by the next leader: every step is idempotent), the lease is released, clients closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from vwserver.clock import Clock, SystemClock
from vwserver.errors import ApiError, UpstreamUnavailable
from vwserver.k8s.backoff import Backoff
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kcp import clusters
from vwserver.k8s.kubeconfig import SERVICE_ACCOUNT_DIR
from vwserver.k8s.lease import LeaderElector
from vwserver.listener import ConnectionLimits, listening
from vwserver.syncer import checks
from vwserver.syncer.clients import Clients, open_clients
from vwserver.syncer.config import SyncerConfig
from vwserver.syncer.endpoints import read_endpoints
from vwserver.syncer.health import health_app
from vwserver.syncer.metrics import SyncerMetrics
from vwserver.syncer.sync_loop import ResourceController

log = logging.getLogger(__name__)

T = TypeVar("T")


class StateLog:
    """Logs a condition once when it begins (or changes) and once when it ends, however often
    it is seen in between: an outage of an hour is two lines, not a warning per retry."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.current: str | None = None

    def failing(self, state: str, detail: str) -> None:
        if state != self.current:
            self.current = state
            log.warning("%s: %s (retrying with backoff)", self.what, detail)

    def ok(self) -> None:
        if self.current is not None:
            log.info("%s: ok again", self.what)
            self.current = None


def describe(error: Exception, *, side: str) -> str:
    """``downstream unreachable: <cause>`` or ``downstream refused: <status>``: what /readyz
    and the log say about a failed call."""
    if isinstance(error, UpstreamUnavailable):
        return f"{side} unreachable: {error}"
    return f"{side} refused: {error}"


class Syncer:
    def __init__(
        self,
        config: SyncerConfig,
        *,
        base_dir: Path,
        clock: Clock | None = None,
        identity: str | None = None,
        service_account_dir: Path = SERVICE_ACCOUNT_DIR,
        backoff: Backoff | None = None,
        confirm_delays: Sequence[float] = checks.CONFIRM_DELAYS,
    ) -> None:
        """``service_account_dir``: where ``inCluster`` finds the ServiceAccount (for tests);
        ``backoff``: the waits between retries of the startup checks and endpoint reads;
        ``confirm_delays``: how long a resource must stay unserved before that is a verdict."""
        self.config = config
        self.metrics = SyncerMetrics()
        self.controllers: list[ResourceController] = []
        self.identity = identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        #: Base URL of the health server once it listens (``http://host:port``).
        self.health_url: str | None = None
        self.elector: LeaderElector | None = None
        self._base_dir = base_dir
        self._service_account_dir = service_account_dir
        self._clock = clock or SystemClock()
        self._backoff = backoff or Backoff(initial=1.0, maximum=30.0)
        self._confirm_delays = confirm_delays
        self._leading = False
        self._upstream_server = ""
        self._downstream_base = ""
        #: Why the syncer is not syncing right now, before the controllers' own reasons.
        self._blocked: str | None = "starting"
        #: Endpoint URLs whose discovery serves every configured resource.
        self._checked_endpoints: set[str] = set()
        self._endpoint_problems: dict[str, str] = {}

    # --- SyncerState (health) ---------------------------------------------------------------------

    def readiness(self) -> list[str]:
        """Why this replica is not ready (``/readyz`` 503), most fundamental first."""
        if self._blocked is not None:
            return [self._blocked]
        elector = self.elector
        if elector is not None and elector.last_error is not None:
            side = "downstream unreachable" if not elector.reachable else "downstream refused"
            return [f"{side}: {elector.last_error} (lease {elector.lease})"]
        if elector is not None and not elector.is_leader:
            return []  # a standby has nothing to sync and is fine
        if not self._leading:
            return ["not started"]
        endpoint_problems = [
            f"upstream {url}: {problem}" for url, problem in self._endpoint_problems.items()
        ]
        return endpoint_problems + [p for c in self.controllers for p in c.problems()]

    def readiness_notes(self) -> list[str]:
        """What a ready replica is doing, when it is not the obvious (``/readyz`` 200 body):
        waiting as a standby, or standing back from objects another syncer owns (it syncs
        everything else, so it stays ready: a rollout must not stall on another syncer's
        objects; ``vwserver_syncer_contested_objects`` is the metric to alert on)."""
        if self.readiness():
            return []
        elector = self.elector
        if elector is not None and not elector.is_leader:
            holder = f" held by {elector.holder}" if elector.holder else ""
            return [f"standby: waiting for the lease {elector.lease}{holder}"]
        return [line for c in self.controllers if (line := c.contention()) is not None]

    def metrics_text(self) -> bytes:
        return self.metrics.render()

    def stuck_objects(self) -> list[dict[str, str]]:
        return [
            {
                "resource": s.resource,
                "cluster": s.key.cluster,
                "namespace": s.key.namespace,
                "name": s.key.name,
                "since": s.since,
                "message": s.message,
            }
            for c in self.controllers
            for s in c.stuck.values()
        ]

    @property
    def synced(self) -> bool:
        return self._leading and all(c.synced for c in self.controllers)

    # --- running ----------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Sync until ``stop`` is set. Raises :class:`~vwserver.errors.ConfigError` for a
        configuration that cannot work (files, credentials, resources the servers do not
        serve); never for an outage."""
        cfg = self.config
        async with contextlib.AsyncExitStack() as stack:
            clients = await stack.enter_async_context(
                open_clients(
                    cfg, base_dir=self._base_dir, service_account_dir=self._service_account_dir
                )
            )
            self._upstream_server = clients.upstream_server
            self._downstream_base = clients.downstream_base
            await stack.enter_async_context(self._health_server())
            if not await _until_stopped(self._check_downstream(clients.downstream), stop):
                return
            if cfg.leader_election.enabled:
                le = cfg.leader_election
                self.elector = LeaderElector(
                    client=clients.downstream,
                    base=self._downstream_base,
                    namespace=le.namespace,
                    name=cfg.lease_name,
                    identity=self.identity,
                    clock=self._clock,
                    lease_duration=le.lease_duration_seconds,
                    renew_deadline=le.renew_deadline_seconds,
                    retry_period=le.retry_period_seconds,
                )
            try:
                while not stop.is_set():
                    if self.elector is not None:
                        # never raises for an unreachable downstream: it retries until it leads
                        if not await _until_stopped(self.elector.acquire(), stop):
                            break
                        self.metrics.leader.set(1)
                    lost = await self._lead(clients, stop)
                    self.metrics.leader.set(0)
                    if not lost:
                        break
                    log.warning("lost the lease: controllers stopped; campaigning again")
            finally:
                if self.elector is not None:
                    await self.elector.release()

    async def _check_downstream(self, downstream: KubeClient) -> None:
        """The downstream types are served by the downstream cluster; retried until there is
        an answer (ConfigError when it is no)."""
        where = f"the downstream cluster {self._downstream_base}"
        wanted = checks.downstream_wanted(self.config.resources)
        self._blocked = f"checking downstream discovery at {self._downstream_base}"
        await self._retrying(
            lambda: checks.check_served(
                downstream,
                self._downstream_base,
                wanted,
                where=where,
                status=False,
                clock=self._clock,
                confirm_delays=self._confirm_delays,
            ),
            side="downstream",
            what="downstream discovery",
        )
        self._blocked = None

    async def _retrying(self, attempt: Callable[[], Awaitable[T]], *, side: str, what: str) -> T:
        """``attempt()`` until it answers: ApiError / UpstreamUnavailable are retried with
        backoff and shown in ``/readyz``; anything else (ConfigError) ends the wait."""
        states = StateLog(what)
        failures = 0
        while True:
            try:
                result = await attempt()
            except (ApiError, UpstreamUnavailable) as e:
                failures += 1
                reason = describe(e, side=side)
                self._blocked = f"{what}: {reason}"
                states.failing(type(e).__name__, reason)
                await self._clock.sleep(self._backoff.delay(failures))
                continue
            states.ok()
            return result

    async def _lead(self, clients: Clients, stop: asyncio.Event) -> bool:
        """Sync until ``stop`` (False) or until the lease is lost (True)."""
        self.controllers = [
            ResourceController(
                config=self.config,
                resource=resource,
                upstream=clients.endpoints,  # every upstream call of a controller is to an endpoint
                downstream=clients.downstream,
                downstream_base=self._downstream_base,
                metrics=self.metrics,
                clock=self._clock,
            )
            for resource in self.config.resources
        ]
        tasks = {
            asyncio.create_task(c.run(), name=f"controller {c.name}") for c in self.controllers
        }
        tasks.add(
            asyncio.create_task(
                self._endpoints_loop(clients.upstream, clients.endpoints), name="endpoints"
            )
        )
        stopped = asyncio.create_task(stop.wait(), name="stop")
        holding = (
            asyncio.create_task(self.elector.hold(), name="lease")
            if self.elector is not None
            else None
        )
        watched = {stopped, *tasks, *([holding] if holding else [])}
        self._leading = True
        try:
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._leading = False
            for task in watched:
                task.cancel()
            await asyncio.gather(*watched, return_exceptions=True)
        for task in done & tasks:
            # a controller that ended on its own crashed, and the endpoints loop ends only on a
            # ConfigError (an endpoint that does not serve a configured resource): surface it
            task.result()
        return holding is not None and holding in done

    async def _endpoints_loop(self, upstream: KubeClient, endpoints: KubeClient) -> None:
        """Hand the controllers the endpoint URLs — once every one of them has passed its
        discovery check — and keep them current."""
        cfg = self.config.upstream
        states = StateLog(f"endpoint slice {cfg.endpoint_slice.name}" if cfg.endpoint_slice else "")
        current: list[str] | None = None
        failures = 0
        while True:
            urls: list[str] | None = list(cfg.urls)
            if cfg.endpoint_slice is not None:
                try:
                    urls = await read_endpoints(
                        upstream, server=self._upstream_server, ref=cfg.endpoint_slice
                    )
                    states.ok()
                except (ApiError, UpstreamUnavailable) as e:
                    # Keep the last known endpoints: a failed read is not "no shards".
                    states.failing(type(e).__name__, describe(e, side="kcp"))
                    urls = None
            unchecked = await self._check_endpoints(endpoints, urls or [])
            # Only a complete, checked set is handed over: a shard left out would look like
            # its objects were deleted.
            if urls is not None and not unchecked and urls != current:
                log.info("upstream endpoints: %s", urls or "(none yet)")
                current = urls
                self._set_endpoints(urls)
            if unchecked or urls is None:
                failures += 1
                delay = self._backoff.delay(failures)
                if cfg.endpoint_slice is not None:
                    delay = min(delay, cfg.refresh_seconds)
            elif cfg.endpoint_slice is None:
                await asyncio.Event().wait()  # static and checked: nothing more to do
                return
            else:
                failures, delay = 0, cfg.refresh_seconds
            await self._clock.sleep(delay)

    async def _check_endpoints(self, client: KubeClient, urls: list[str]) -> list[str]:
        """Check the discovery of every URL not checked yet; the ones without an answer."""
        wanted = checks.upstream_wanted(self.config.resources)
        unchecked = []
        for url in urls:
            if url in self._checked_endpoints:
                continue
            base = clusters(url)  # the wildcard serves the export's discovery
            try:
                await checks.check_served(
                    client,
                    base,
                    wanted,
                    where=base,
                    status=True,
                    clock=self._clock,
                    confirm_delays=self._confirm_delays,
                )
            except (ApiError, UpstreamUnavailable) as e:
                problem = f"checking discovery: {describe(e, side='endpoint')}"
                if self._endpoint_problems.get(url) != problem:
                    log.warning("upstream %s: %s (retrying with backoff)", url, problem)
                self._endpoint_problems[url] = problem
                unchecked.append(url)
                continue
            if self._endpoint_problems.pop(url, None) is not None:
                log.info("upstream %s: discovery checked", url)
            self._checked_endpoints.add(url)
        for url in set(self._endpoint_problems) - set(urls):
            del self._endpoint_problems[url]  # gone from the slice
        return unchecked

    def _set_endpoints(self, urls: list[str]) -> None:
        self.metrics.endpoints.set(len(urls))
        for controller in self.controllers:
            controller.set_endpoints(urls)

    @contextlib.asynccontextmanager
    async def _health_server(self) -> AsyncIterator[None]:
        health = self.config.health
        if not health.enabled:
            yield
            return
        # vwserver's own listener, as ``serve``'s: bounded heads and timeouts, malformed
        # requests answered with a Status, no ``Server`` header.
        async with listening(
            health_app(self), health.host, health.port, limits=ConnectionLimits()
        ) as site:
            host, port = site.address
            self.health_url = f"http://{host}:{port}"
            log.info("health and metrics on %s", self.health_url)
            yield


async def _until_stopped(work: Coroutine[Any, Any, None], stop: asyncio.Event) -> bool:
    """Await ``work`` unless ``stop`` is set first; True if ``work`` finished."""
    task = asyncio.create_task(work)
    stopped = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, stopped):
            t.cancel()
        await asyncio.gather(task, stopped, return_exceptions=True)
    if task in done:
        task.result()
        return True
    return False
