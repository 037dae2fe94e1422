"""The shared resources of one vwserver: started on first use, stopped when idle.

A shared resource costs an upstream watch and the memory of every object of its collection, so
it runs only while someone uses it: :meth:`CacheRegistry.acquire` starts it for the first client
(of any slice) and hands the running one to every later client; :meth:`CacheRegistry.release`
and the end of its last subscription start an idle period, and a resource still unused
``idle_seconds`` later is stopped and forgotten. The idle period runs on the injected
:class:`~vwserver.clock.Clock`, so tests drive it with fake time. Resources are keyed by
(upstream virtual-workspace URL, API path, representation): slices of one export share them,
each upstream shard has its own, and a collection read as Tables (``kubectl get``) is a resource
of its own (:meth:`CacheRegistry.acquire_table`, :mod:`vwserver.cache.table_resource`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from vwserver.cache.shared import SharedResource
from vwserver.cache.table_resource import SharedTable
from vwserver.clock import Clock
from vwserver.k8s.backoff import Backoff
from vwserver.k8s.client import KubeClient
from vwserver.metrics import ServerMetrics

__all__ = ["CacheRegistry"]

ResourceKey = tuple[str, str, bool]
"""(upstream, API path, as Table rows)"""


def _key(resource: SharedResource) -> ResourceKey:
    return (resource.upstream, resource.api_path, resource.table)


class CacheRegistry:
    """Every :class:`SharedResource` of one server."""

    def __init__(
        self,
        *,
        client: KubeClient,
        clock: Clock,
        idle_seconds: float = 300,
        window: int = 4096,
        metrics: ServerMetrics | None = None,
        page_size: int = 500,
        watch_timeout: int = 300,
        backoff: Backoff | None = None,
    ) -> None:
        self._client = client
        self._clock = clock
        self._idle_seconds = idle_seconds
        self._window = window
        self._metrics = metrics
        self._page_size = page_size
        self._watch_timeout = watch_timeout
        self._backoff = backoff
        self._resources: dict[ResourceKey, SharedResource] = {}
        self._timers: dict[ResourceKey, asyncio.Task[None]] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._closed = False
        if metrics is not None:
            metrics.watch_cache(self.stats)

    async def acquire(self, *, upstream: str, api_path: str) -> SharedResource:
        """The running shared resource for ``api_path`` (e.g. ``/apis/g/v/widgets``) in the
        virtual workspace ``upstream``, started if it is not; hold it until :meth:`release`.
        It may not have synced yet (:meth:`SharedResource.wait_synced`)."""
        return self._acquire((upstream.rstrip("/"), api_path, False))

    async def acquire_table(self, *, upstream: str, api_path: str) -> SharedTable:
        """:meth:`acquire` for the collection as Table rows (what ``kubectl get`` reads)."""
        resource = self._acquire((upstream.rstrip("/"), api_path, True))
        assert isinstance(resource, SharedTable)
        return resource

    def running(self, *, upstream: str, api_path: str) -> SharedResource | None:
        """The shared resource for ``api_path`` in ``upstream`` if one runs and has synced,
        without starting one or holding it (a write's check reads one object from it at once,
        :mod:`vwserver.proxy.write_plan`); None otherwise."""
        resource = self._resources.get((upstream.rstrip("/"), api_path, False))
        if resource is None or resource.stopped or not resource.synced:
            return None
        return resource

    def _acquire(self, key: ResourceKey) -> SharedResource:
        if self._closed:
            raise RuntimeError("the cache registry is closed")
        resource = self._resources.get(key)
        if resource is None:
            upstream, api_path, table = key
            options: dict[str, Any] = {
                "client": self._client,
                "clock": self._clock,
                "upstream": upstream,
                "api_path": api_path,
                "window": self._window,
                "page_size": self._page_size,
                "watch_timeout": self._watch_timeout,
                "backoff": self._backoff,
                "metrics": self._metrics,
            }
            if table:
                resource = SharedTable(
                    **options, sibling=lambda: self._resources.get((upstream, api_path, False))
                )
            else:
                resource = SharedResource(**options)
            resource.on_idle = self._idle
            self._resources[key] = resource
            resource.start()
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        resource.users += 1
        return resource

    def release(self, resource: SharedResource) -> None:
        """One holder is done with ``resource`` (its subscriptions may still run)."""
        if resource.users <= 0:
            raise RuntimeError(f"{resource.url} released more often than acquired")
        resource.users -= 1
        if resource.idle and not resource.synced and resource.last_error is not None:
            # Never synced, its list failed, and nobody waits: a resource the upstream does not
            # serve (a typo in a client's path) must not keep a reflector retrying for the idle
            # period. One whose first list is still running (a large collection can take longer
            # than a reader waits) keeps going: the next reader finds it synced.
            key = _key(resource)
            if self._resources.get(key) is resource:
                del self._resources[key]
                task = asyncio.create_task(resource.stop(), name=f"cache stop {resource.url}")
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)
        elif resource.idle:
            self._idle(resource)

    async def aclose(self) -> None:
        """Stop every resource (their subscriptions end)."""
        self._closed = True
        timers, self._timers = list(self._timers.values()), {}
        for timer in timers:
            timer.cancel()
        resources, self._resources = list(self._resources.values()), {}
        stopping = list(self._stopping)
        await asyncio.gather(
            *timers, *stopping, *(r.stop() for r in resources), return_exceptions=True
        )

    @property
    def client(self) -> KubeClient:
        """vwserver's own client of the upstreams (the identity the cache reads with)."""
        return self._client

    @property
    def clock(self) -> Clock:
        return self._clock

    def resources(self) -> list[SharedResource]:
        """The running shared resources."""
        return list(self._resources.values())

    def stats(self) -> list[dict[str, Any]]:
        """Per resource: url, objects, raw_bytes, window, rv, oldest_rv, synced, last_error,
        subscribers, users, max_queue_depth."""
        return [resource.stats() for resource in self._resources.values()]

    def __len__(self) -> int:
        return len(self._resources)

    def _idle(self, resource: SharedResource) -> None:
        """``resource`` became idle: stop it unless it is used again within the idle period."""
        key = _key(resource)
        if self._closed or self._resources.get(key) is not resource:
            return
        previous = self._timers.pop(key, None)
        if previous is not None:
            previous.cancel()
        self._timers[key] = asyncio.create_task(
            self._expire(key, resource), name=f"cache idle {resource.url}"
        )

    async def _expire(self, key: ResourceKey, resource: SharedResource) -> None:
        await self._clock.sleep(self._idle_seconds)
        if self._resources.get(key) is not resource or not resource.idle:
            return
        del self._resources[key]
        if self._timers.get(key) is asyncio.current_task():
            del self._timers[key]
        await resource.stop()
