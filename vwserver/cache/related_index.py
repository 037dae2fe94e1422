"""A slice's live reference index: which claimed objects its visible objects name.

A ``referencedBy`` rule (:mod:`vwserver.related`) makes a Secret visible while an object
visible through the slice names it. :class:`SliceReferences` follows each referencing
collection of one slice (``clusters/*/<group>/<version>/<resource>`` of its export) through the
shared watch cache — the same :class:`~vwserver.cache.shared.SharedResource` every LIST and
WATCH of that resource reads, so the index costs no upstream request of its own — and keeps
the slice's :class:`~vwserver.related.ReferenceIndex` in step: per change of a referencing
object, what it references now if the slice sees it (:func:`vwserver.cache.views.visible`,
holds included: an object another slice holds references nothing here), nothing otherwise.
The index's transitions (a claimed object became visible or invisible) are handed to the
listeners — the watches of claimed resources through the slice — synchronously, on the loop.

I/O is the subscription loop only; the decisions are :mod:`vwserver.related`'s and
:mod:`vwserver.cache.views`'s. A relist (the subscription ends ``relisted`` or
``overflowed``) rebuilds the collection's part of the index from the store with
:meth:`~vwserver.related.ReferenceIndex.replace`, whose transitions are exactly the
difference.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Final

import msgspec

from vwserver.cache.entries import Change, Entry
from vwserver.cache.registry import CacheRegistry
from vwserver.cache.shared import SharedResource
from vwserver.cache.views import SliceView, visible
from vwserver.related import (
    ReferenceIndex,
    References,
    ReferrerKey,
    RelatedRules,
    Transition,
    references_of,
)

log = logging.getLogger(__name__)

QUEUE: Final = 4096
"""Changes a subscription of a referencing collection may queue (an overflow rebuilds)."""
SYNC_TIMEOUT: Final = 30.0

Listener = Callable[[list[Transition]], None]


class SliceReferences:
    """One slice's reference index over the referencing collections its rules name."""

    def __init__(
        self,
        *,
        registry: CacheRegistry,
        upstream: str,
        rules: RelatedRules,
        view: Callable[[], SliceView],
    ) -> None:
        """``view``: the slice's membership now (its selector and its peers'), asked per
        change so that the index follows the current route table."""
        self.index = ReferenceIndex()
        self._registry = registry
        self._upstream = upstream
        self._rules = rules
        self._view = view
        self._listeners: set[Listener] = set()
        self._synced = {src.collection_path: asyncio.Event() for src in rules.sources()}
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        if self._tasks:
            return
        for source in self._rules.sources():
            path = source.collection_path
            self._tasks.append(
                asyncio.create_task(self._follow(source.source, path), name=f"references {path}")
            )

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def wait_synced(self, timeout: float) -> bool:  # noqa: ASYNC109 - a bound
        """Whether every referencing collection was read into the index within ``timeout``."""
        try:
            async with asyncio.timeout(timeout):
                for event in self._synced.values():
                    await event.wait()
        except TimeoutError:
            return False
        return True

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` with every batch of transitions from now on; returns the undo."""
        self._listeners.add(listener)
        return lambda: self._listeners.discard(listener)

    def _publish(self, transitions: list[Transition]) -> None:
        if transitions:
            for listener in list(self._listeners):
                listener(transitions)

    def _refs(self, source: tuple[str, str], item: Entry | None) -> References:
        """What the referencing object ``item`` references now through the slice."""
        if item is None or not visible(self._view(), item.meta):
            return {}
        try:
            obj: Any = msgspec.json.decode(item.raw)
        except msgspec.DecodeError:
            return {}
        if not isinstance(obj, dict):
            return {}
        return references_of(self._rules, group=source[0], resource=source[1], obj=obj)

    @staticmethod
    def _key(source: tuple[str, str], item: Entry) -> ReferrerKey:
        meta = item.meta
        return (source[0], source[1], meta.cluster, meta.namespace, meta.name)

    async def _follow(self, source: tuple[str, str], path: str) -> None:
        resource = await self._registry.acquire(upstream=self._upstream, api_path=path)
        try:
            while not resource.stopped:
                if not await resource.wait_synced(SYNC_TIMEOUT):
                    log.info("references from %s: not synced yet (%s)", path, resource.last_error)
                    await asyncio.sleep(1)
                    continue
                await self._run(source, path, resource)
        finally:
            self._registry.release(resource)

    async def _run(self, source: tuple[str, str], path: str, resource: SharedResource) -> None:
        store = resource.store
        subscription = resource.subscribe(from_rv=store.rv, queue_size=QUEUE)
        try:
            entries = [(self._key(source, e), self._refs(source, e)) for e in store.snapshot()]
            self._publish(self.index.replace(entries, scope=source))
            self._synced[path].set()
            async for item in subscription:
                if not isinstance(item, Change):
                    continue  # a bookmark: nothing references anything new
                some = item.new or item.deleted or item.prev
                assert some is not None
                self._publish(
                    self.index.update(self._key(source, some), self._refs(source, item.new))
                )
        finally:
            subscription.close()


class ReferenceIndexes:
    """Every served slice's :class:`SliceReferences` (per route and shard upstream), started
    on first use, stopped when its route is retired."""

    def __init__(self, registry: CacheRegistry) -> None:
        self._registry = registry
        # keyed by the route object's id; the route itself is kept so that the id stays its own
        self._slices: dict[tuple[int, str], tuple[object, SliceReferences]] = {}
        self._retiring: set[asyncio.Task[None]] = set()

    def get(
        self,
        *,
        route: object,
        retired: asyncio.Event,
        upstream: str,
        rules: RelatedRules,
        view: Callable[[], SliceView],
    ) -> SliceReferences:
        key = (id(route), upstream)
        found = self._slices.get(key)
        if found is not None:
            return found[1]
        refs = SliceReferences(registry=self._registry, upstream=upstream, rules=rules, view=view)
        self._slices[key] = (route, refs)
        refs.start()

        async def retire() -> None:
            await retired.wait()
            self._slices.pop(key, None)
            await refs.stop()

        task = asyncio.create_task(retire(), name=f"references retire {upstream}")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
        return refs

    async def aclose(self) -> None:
        for task in list(self._retiring):
            task.cancel()
        for _, refs in list(self._slices.values()):
            await refs.stop()
        self._slices.clear()
