"""One syncer process: clients, health server, leader election, endpoints and controllers.

:meth:`Syncer.run` is what ``vwserver sync`` runs and what the e2e tests run in-process:

1. open one client for kcp and one for the downstream cluster (kubeconfigs — exec plugins
   included — or the pod's ServiceAccount, ``inCluster``: :mod:`vwserver.k8s.kubeconfig`);
2. serve ``/healthz`` ``/readyz`` ``/metrics`` (:mod:`vwserver.health`, as ``serve`` does);
3. with leader election: wait for the Lease, then lead until ``stop`` is set or the lease is
   lost (then controllers stop at once and the replica campaigns again);
4. while leading: resolve the upstream endpoint URLs (static, or re-read from the endpoint slice
   every ``refreshSeconds``) and run one :class:`ResourceController` per resource.

Graceful shutdown (``stop`` set, e.g. SIGTERM): workers are cancelled (an interrupted step is
redone by the next leader: every step is idempotent), the lease is released, clients closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import uuid
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

from aiohttp import web

from vwserver.clock import Clock, SystemClock
from vwserver.config.base import client_auth
from vwserver.errors import UpstreamUnavailable
from vwserver.k8s.client import ApiError, KubeClient
from vwserver.k8s.kubeconfig import SERVICE_ACCOUNT_DIR
from vwserver.k8s.lease import LeaderElector
from vwserver.syncer.config import SyncerConfig
from vwserver.syncer.endpoints import read_endpoints
from vwserver.syncer.health import health_app
from vwserver.syncer.metrics import SyncerMetrics
from vwserver.syncer.sync_loop import ResourceController

log = logging.getLogger(__name__)


class Syncer:
    def __init__(
        self,
        config: SyncerConfig,
        *,
        base_dir: Path,
        clock: Clock | None = None,
        identity: str | None = None,
        service_account_dir: Path = SERVICE_ACCOUNT_DIR,
    ) -> None:
        """``service_account_dir``: where ``inCluster`` finds the ServiceAccount (for tests)."""
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
        self._leading = False
        self._upstream_server = ""
        self._downstream_base = ""

    # --- SyncerState (health) ---------------------------------------------------------------------

    def readiness(self) -> list[str]:
        if self.elector is not None and not self.elector.is_leader:
            return []  # a standby has nothing to sync and is fine
        if not self._leading:
            return ["not started"]
        return [p for c in self.controllers for p in c.problems()]

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
        cfg = self.config
        sa_dir = self._service_account_dir
        up_auth = await client_auth(
            cfg.upstream, field="$.upstream", base=self._base_dir, service_account_dir=sa_dir
        )
        down_auth = await client_auth(
            cfg.downstream, field="$.downstream", base=self._base_dir, service_account_dir=sa_dir
        )
        self._upstream_server, self._downstream_base = up_auth.server, down_auth.server
        async with (
            KubeClient(auth=up_auth) as upstream,
            KubeClient(auth=down_auth) as downstream,
            self._health_server(),
        ):
            if cfg.leader_election.enabled:
                le = cfg.leader_election
                self.elector = LeaderElector(
                    client=downstream,
                    base=down_auth.server,
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
                        if not await _until_stopped(self.elector.acquire(), stop):
                            break
                        self.metrics.leader.set(1)
                    lost = await self._lead(upstream, downstream, stop)
                    self.metrics.leader.set(0)
                    if not lost:
                        break
            finally:
                if self.elector is not None:
                    await self.elector.release()

    async def _lead(
        self, upstream: KubeClient, downstream: KubeClient, stop: asyncio.Event
    ) -> bool:
        """Sync until ``stop`` (False) or until the lease is lost (True)."""
        self.controllers = [
            ResourceController(
                config=self.config,
                resource=resource,
                upstream=upstream,
                downstream=downstream,
                downstream_base=self._downstream_base,
                metrics=self.metrics,
                clock=self._clock,
            )
            for resource in self.config.resources
        ]
        tasks = {
            asyncio.create_task(c.run(), name=f"controller {c.name}") for c in self.controllers
        }
        tasks.add(asyncio.create_task(self._endpoints_loop(upstream), name="endpoints"))
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
            task.result()  # a controller that ended on its own crashed: surface it
        return holding is not None and holding in done

    async def _endpoints_loop(self, upstream: KubeClient) -> None:
        cfg = self.config.upstream
        if cfg.endpoint_slice is None:
            self._set_endpoints(cfg.urls)
            await asyncio.Event().wait()  # static: nothing more to do
            return
        current: list[str] | None = None
        while True:
            try:
                urls = await read_endpoints(
                    upstream, server=self._upstream_server, ref=cfg.endpoint_slice
                )
            except (ApiError, UpstreamUnavailable) as e:
                # Keep the last known endpoints: a failed read is not "no shards".
                log.warning("cannot read endpoint slice %s: %s", cfg.endpoint_slice.name, e)
            else:
                if urls != current:
                    log.info("upstream endpoints: %s", urls or "(none yet)")
                    current = urls
                    self._set_endpoints(urls)
            await self._clock.sleep(cfg.refresh_seconds)

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
        runner = web.AppRunner(health_app(self), access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, health.host, health.port)
            await site.start()
            host, port = runner.addresses[0][:2]
            self.health_url = f"http://{host}:{port}"
            log.info("health and metrics on %s", self.health_url)
            yield
        finally:
            await runner.cleanup()


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
