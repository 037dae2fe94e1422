"""List-then-watch with resume, relist on 410 Gone, and backoff: the controller's view of kcp.

The informer keeps no cache of its own; it reports what it sees to two callbacks — the complete
set after every (re)list, and each change after that — and the controller keeps the objects.
A watch that ends normally is resumed from the last resourceVersion seen (bookmarks included);
a 410 Gone (the resourceVersion expired) means relisting; transient failures back off
exponentially with jitter, so a kcp outage never becomes a tight loop (issue #4 §6).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from vwserver.errors import UpstreamUnavailable
from vwserver.k8s.client import JSON, ApiError, KubeClient

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with full jitter; ``delay(n)`` for the n-th consecutive failure."""

    initial: float = 0.5
    maximum: float = 30.0
    rand: Callable[[], float] = random.random

    def delay(self, failures: int) -> float:
        ceiling = min(self.maximum, self.initial * 2.0 ** max(0, failures - 1))
        return ceiling / 2 + float(self.rand()) * ceiling / 2


class Informer:
    def __init__(
        self,
        *,
        client: KubeClient,
        path: str,
        on_list: Callable[[list[JSON]], None],
        on_event: Callable[[str, JSON], None],
        query: Sequence[tuple[str, str]] = (),
        backoff: Backoff | None = None,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        self._client = client
        self._path = path
        self._query = tuple(query)  # e.g. a fieldSelector, on the list and the watch alike
        self._on_list = on_list
        self._on_event = on_event
        self._backoff = backoff or Backoff()
        self._sleep = sleep

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                rv: str | None = await self._list()
                failures = 0
                while rv is not None:
                    rv = await self._watch(rv)
                    failures = 0
            except (UpstreamUnavailable, ApiError) as e:
                if isinstance(e, ApiError) and not e.transient and e.code != 410:
                    log.error("listing %s failed: %s", self._path, e)
                failures += 1
                delay = self._backoff.delay(failures)
                log.warning("informer on %s: %s; retrying in %.1fs", self._path, e, delay)
                await self._sleep(delay)

    async def _list(self) -> str:
        doc = await self._client.request("GET", self._path, query=self._query)
        self._on_list(list(doc.get("items") or []))
        return str((doc.get("metadata") or {}).get("resourceVersion", ""))

    async def _watch(self, rv: str) -> str | None:
        """Watch from ``rv``; the resourceVersion to resume from, or None to relist."""
        query = [*self._query, ("resourceVersion", rv), ("allowWatchBookmarks", "true")]
        async for event in self._client.watch(self._path, query=query):
            kind = event.get("type")
            obj = event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    log.info(
                        "informer on %s: resourceVersion %s expired; relisting", self._path, rv
                    )
                    return None
                raise ApiError(code=int(obj.get("code") or 500), body=b"", url=self._path)
            rv = str((obj.get("metadata") or {}).get("resourceVersion", rv))
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self._on_event(str(kind), obj)
        return rv
