"""The one list+watch loop of vwserver: a collection, mirrored into a handler, forever.

client-go's reflector, reduced to what vwserver's loops need; every loop that follows objects in
kcp or a downstream cluster runs one (the slice controller, the syncer, through
:class:`~vwserver.k8s.cache.Cache` where a loop keeps the objects):

* **Paged list.** The collection is listed in pages of ``page_size`` (``limit``/``continue``:
  every page is served from the first page's snapshot, so the result is consistent at its
  resourceVersion) and handed over whole: :meth:`ReflectorHandler.on_list`.
* **Watch with resume.** Then it is watched from the list's resourceVersion. Every event — and
  every BOOKMARK, asked for with ``allowWatchBookmarks`` — advances :attr:`Reflector.
  resource_version`; when a watch ends (the server's ``timeoutSeconds``, a dropped connection, an
  error) the next one resumes from there: no event is lost, none is replayed.
* **410 Gone.** The resourceVersion fell out of the server's history (etcd compaction, a
  restarted watch cache): relist at once (after a list that was itself Gone: with backoff).
* **Backoff with jitter.** Any other failure (unreachable, 5xx, 403 while RBAC settles, garbage
  on the stream) waits :class:`~vwserver.k8s.backoff.Backoff` on the injected
  :class:`~vwserver.clock.Clock`, and is kept in :attr:`Reflector.last_error` for ``/readyz`` and
  logs — never swallowed. A watch that ends without a single event (not even a bookmark) also
  backs off: a server that closes every watch at once must not make this spin.
* **Idle timeout.** Each watch asks for ``timeoutSeconds`` drawn from ``[watch_timeout,
  2*watch_timeout)`` (so that many clients do not re-watch together, as client-go does), and
  gives up on a stream that sends nothing for ``idle_grace`` seconds longer than that: a silently
  dead connection would otherwise block the loop forever.
* **Synced.** :attr:`Reflector.synced` is set after the first complete list.

Handlers are synchronous and must be quick (record, enqueue). A DELETED event of a label-selector
watch carries the object's *previous* content when it stopped matching (observed on kcp,
tests/e2e/test_kcp_testbed.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from vwserver.clock import Clock
from vwserver.errors import ApiError, ApiGone, UpstreamUnavailable
from vwserver.k8s.backoff import Backoff
from vwserver.k8s.client import JSON, KubeClient

log = logging.getLogger(__name__)


class ReflectorHandler(Protocol):
    def on_list(self, items: list[JSON], resource_version: str) -> None:
        """The whole collection at ``resource_version``: after the first list and every relist
        (objects missing from it are gone)."""
        ...

    def on_event(self, kind: str, obj: JSON) -> None:
        """One change after that: ``kind`` is ADDED, MODIFIED or DELETED."""
        ...

    def on_bookmark(self, resource_version: str) -> None:
        """Nothing changed up to ``resource_version`` (a watch BOOKMARK)."""
        ...


H = TypeVar("H", bound=ReflectorHandler)


def resource_version(obj: JSON) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class Reflector(Generic[H]):
    """Lists and watches ``url`` (a collection, e.g. ``<vw>/clusters/*/apis/g/v/r``) into
    :attr:`handler`; :meth:`run` until cancelled."""

    def __init__(
        self,
        *,
        name: str,
        client: KubeClient,
        url: str,
        handler: H,
        clock: Clock,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        watch_timeout: int = 300,
        idle_grace: float = 60.0,
        backoff: Backoff | None = None,
        on_restart: Callable[[str], None] | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.name = name
        self.url = url
        self.handler = handler
        self.resource_version = ""
        """Where the next watch resumes; empty: list first."""
        self.synced = asyncio.Event()
        self.last_error: str | None = None
        self._client = client
        self._clock = clock
        selectors = (("labelSelector", label_selector), ("fieldSelector", field_selector))
        self._selectors = [(param, value) for param, value in selectors if value]
        self._page_size = page_size
        self._watch_timeout = watch_timeout
        self._idle_grace = idle_grace
        self._backoff = backoff or Backoff()
        self._on_restart = on_restart or (lambda cause: None)
        """Told ``"gone"`` or ``"error"`` whenever the loop starts over (for metrics)."""
        self._rand = rand

    async def run(self) -> None:
        failures = 0
        while True:
            listing = not self.resource_version
            try:
                if listing:
                    await self._list()
                    failures = 0
                    listing = False
                delivered = await self._watch()
                self.last_error = None
                if delivered:
                    failures = 0
                    continue
                failures += 1  # ended without a single event: do not spin
            except ApiGone as e:
                # client-go does the same: the resourceVersion is too old, list again
                log.info("%s: %s; relisting", self.name, e.message or "resourceVersion expired")
                self._on_restart("gone")
                self.resource_version = ""
                if not listing:
                    continue
                failures += 1  # the list itself was Gone (an expired continue token)
            except (ApiError, UpstreamUnavailable) as e:
                failures += 1
                self.last_error = str(e)
                self._on_restart("error")
                log.warning("%s: %s (retry %d with backoff)", self.name, e, failures)
            await self._clock.sleep(self._backoff.delay(failures))

    async def _list(self) -> None:
        items: list[JSON] = []
        token = ""
        while True:
            query = [*self._selectors, ("limit", str(self._page_size))]
            if token:
                query.append(("continue", token))
            page = await self._client.request("GET", self.url, query=query)
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            token = str(meta.get("continue") or "")
            if not token:
                break
        rv = str(meta.get("resourceVersion") or "")
        self.handler.on_list(items, rv)
        self.resource_version = rv
        self.last_error = None
        self.synced.set()
        log.debug("%s: listed %d objects at %s", self.name, len(items), rv)

    async def _watch(self) -> bool:
        """One watch from :attr:`resource_version`; True if it delivered any event."""
        timeout = int(self._watch_timeout * (1 + self._rand()))
        query = [
            *self._selectors,
            ("resourceVersion", self.resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout)),
        ]
        delivered = False
        events = self._client.watch(self.url, query=query, idle_timeout=timeout + self._idle_grace)
        async with contextlib.aclosing(events):
            async for event in events:
                delivered = True
                kind, obj = str(event["type"]), event["object"]
                rv = resource_version(obj)
                if kind == "BOOKMARK":
                    if rv:
                        self.resource_version = rv
                        self.handler.on_bookmark(rv)
                    continue
                self.handler.on_event(kind, obj)
                if rv:
                    self.resource_version = rv
        return delivered
