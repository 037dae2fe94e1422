"""List, then watch from the list's resourceVersion; keep a cache; tell a handler what changed.

This is client-go's reflector + store, reduced to what the syncer needs. (The slice controller's
:class:`vwserver.controller.informer.Informer` keeps no cache, lists unpaged and without a label
selector; the syncer needs all three, and a cache diff on relist to see deletions.)

* **Resume.** Every event (and every BOOKMARK, requested with ``allowWatchBookmarks``) advances
  the resourceVersion; when a watch ends (server ``timeoutSeconds``, a dropped connection) the
  next one starts from there, so no event is lost and none is replayed.
* **410 Gone.** The resourceVersion fell out of the server's history (etcd compaction, a
  restarted watch cache): relist at once. The new list is diffed against the cache, so objects
  that vanished meanwhile reach the handler as deletions and changed ones as updates.
* **Backoff.** Any other failure (unreachable, 5xx, 403 while RBAC settles, garbage) waits with
  exponential backoff and jitter (the controller's :class:`~vwserver.controller.informer.Backoff`)
  through an injectable :class:`~vwserver.clock.Clock`, and is kept in
  :attr:`Informer.last_error` for ``/readyz`` and logs — never swallowed.
* **Synced.** :attr:`Informer.synced` is set after the first complete list; until then the
  cache is not evidence that an object is gone (the controller does not sweep before it).

Handlers are synchronous and must be quick (the controller only enqueues keys). A DELETED event
of a label-selector watch carries the object's *previous* content when it stopped matching
(observed on kcp, tests/e2e/test_kcp_testbed.py), which is what lets the controller notice that
an object left its filtered view while still carrying its finalizer.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Hashable
from typing import Protocol

import msgspec

from vwserver.clock import Clock
from vwserver.controller.informer import Backoff
from vwserver.errors import UpstreamUnavailable
from vwserver.k8s.client import JSON, ApiError, KubeClient
from vwserver.syncer.client import list_all, watch

log = logging.getLogger(__name__)


class InformerHandler(Protocol):
    def on_upsert(self, obj: JSON) -> None:
        """An object was added or changed (also: every object after a relist)."""
        ...

    def on_delete(self, obj: JSON) -> None:
        """An object is gone from the view; ``obj`` is its last known state."""
        ...


def resource_version(obj: JSON) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class Informer:
    def __init__(
        self,
        *,
        name: str,
        client: KubeClient,
        url: str,
        handler: InformerHandler,
        key: Callable[[JSON], Hashable | None],
        clock: Clock,
        label_selector: str | None = None,
        backoff: Backoff | None = None,
        page_size: int = 500,
        watch_timeout: int = 300,
        on_restart: Callable[[str], None] | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.name = name
        self.url = url
        self.store: dict[Hashable, JSON] = {}
        self.synced = asyncio.Event()
        self.last_error: str | None = None
        self._client = client
        self._handler = handler
        self._key = key
        self._clock = clock
        self._label_selector = label_selector
        self._backoff = backoff or Backoff()
        self._failures = 0
        self._page_size = page_size
        self._watch_timeout = watch_timeout
        self._on_restart = on_restart or (lambda reason: None)
        self._rand = rand
        self.resource_version = ""

    async def run(self) -> None:
        """List and watch until cancelled."""
        while True:
            try:
                if not self.resource_version:
                    await self._relist()
                delivered = await self._watch()
                self.last_error = None
                if delivered:
                    self._failures = 0
                    continue
                # A watch that ended without a single event (not even a bookmark) may be a
                # server closing every watch at once: do not spin.
                self._failures += 1
            except ApiError as e:
                if e.code == 410:
                    # The resourceVersion is too old: relist now (client-go does the same).
                    log.info("%s: %s; relisting", self.name, e.message)
                    self._on_restart("gone")
                    self.resource_version = ""
                    continue
                self._failed(e)
            except (UpstreamUnavailable, msgspec.DecodeError) as e:
                self._failed(e)
            await self._clock.sleep(self._backoff.delay(self._failures))

    def _failed(self, error: Exception) -> None:
        self._failures += 1
        self.last_error = str(error)
        self._on_restart("error")
        log.warning("%s: %s (retry %d with backoff)", self.name, error, self._failures)

    async def _relist(self) -> None:
        result = await list_all(
            self._client, self.url, label_selector=self._label_selector, page_size=self._page_size
        )
        fresh: dict[Hashable, JSON] = {}
        for obj in result.items:
            key = self._key(obj)
            if key is not None:
                fresh[key] = obj
        old, self.store = self.store, fresh
        self.resource_version = result.resource_version
        for key, obj in old.items():
            if key not in fresh:
                self._handler.on_delete(obj)
        for key, obj in fresh.items():
            previous = old.get(key)
            if previous is None or resource_version(previous) != resource_version(obj):
                self._handler.on_upsert(obj)
        self.synced.set()
        self._failures = 0
        log.debug("%s: listed %d objects at %s", self.name, len(fresh), self.resource_version)

    async def _watch(self) -> bool:
        """One watch from :attr:`resource_version`; True if it delivered any event."""
        delivered = False
        # client-go picks a random timeout in [min, 2*min) so that watches of many clients do
        # not all end (and relist on a restarted server) at the same moment.
        timeout = int(self._watch_timeout * (1 + self._rand()))
        events = watch(
            self._client,
            self.url,
            resource_version=self.resource_version,
            label_selector=self._label_selector,
            timeout_seconds=timeout,
        )
        async for event in events:
            delivered = True
            kind = event.get("type")
            obj: JSON = event.get("object") or {}
            rv = resource_version(obj)
            if kind == "BOOKMARK":
                if rv:
                    self.resource_version = rv
                continue
            key = self._key(obj)
            if key is not None:
                if kind in ("ADDED", "MODIFIED"):
                    self.store[key] = obj
                    self._handler.on_upsert(obj)
                elif kind == "DELETED":
                    self.store.pop(key, None)
                    self._handler.on_delete(obj)
                else:
                    raise UpstreamUnavailable(f"watch {self.url}: unknown event type {kind!r}")
            if rv:
                self.resource_version = rv
        return delivered
