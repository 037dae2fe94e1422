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

A watch from a resourceVersion (a client's LIST, then its WATCH from the LIST's version) must
also get the transitions that happened *between* the two — the reference index moves with
another resource's stream, so nothing on the claimed resource's own stream carries them (a
database created after the LIST makes its Secret visible without any change of the Secret).
The index therefore keeps a bounded history of its transitions (:class:`History`): each with
its sequence number and the resourceVersion of the referencing change that caused it (kcp's
resourceVersions are the shard's etcd revisions, one counter for every resource). A LIST of a
claimed resource served here records which index position its answer reflects
(:meth:`SliceReferences.listed`), and a watch from that LIST's resourceVersion replays exactly
the transitions after it; a watch from a resourceVersion no LIST here answered (another
replica's, the pass-through's) replays those caused by changes after that resourceVersion.
When the history no longer reaches back that far the watch cannot be continued exactly and is
answered 410 Expired (the client relists), as for a resourceVersion older than the window.

I/O is the subscription loop only; the decisions are :mod:`vwserver.related`'s and
:mod:`vwserver.cache.views`'s. A relist (the subscription ends ``relisted`` or
``overflowed``) rebuilds the collection's part of the index from the store with
:meth:`~vwserver.related.ReferenceIndex.replace`, whose transitions are exactly the
difference.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
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

HISTORY: Final = 4096
"""Transitions a slice's index remembers for watches from a resourceVersion."""
LISTED: Final = 256
"""LIST answers whose index position is remembered."""

Listener = Callable[[list[Transition]], None]


@dataclass(frozen=True, slots=True)
class Stamped:
    """One transition of the index: its sequence number (1, 2, ...) and the resourceVersion
    of the referencing change (or relist) that caused it."""

    seq: int
    rv: int
    transition: Transition


class History:
    """The last :data:`HISTORY` transitions, and the index positions LIST answers reflected
    — pure bookkeeping (see the module docstring)."""

    __slots__ = ("_items", "_listed", "_size", "seq")

    def __init__(self, *, size: int = HISTORY, listed: int = LISTED) -> None:
        self._size = size
        self._items: collections.deque[Stamped] = collections.deque(maxlen=size)
        # (lowest rv, highest rv, index position) of LIST answers, newest last
        self._listed: collections.deque[tuple[int, int, int]] = collections.deque(maxlen=listed)
        self.seq = 0
        """The index position: transitions so far."""

    def add(self, transitions: list[Transition], *, rv: int) -> None:
        for t in transitions:
            self.seq += 1
            self._items.append(Stamped(self.seq, rv, t))

    def listed(self, *, lowest: int, highest: int, seq: int) -> None:
        """A LIST was answered at a resourceVersion between ``lowest`` and ``highest`` with
        the index at position ``seq`` or later."""
        self._listed.append((lowest, highest, seq))

    def since(self, rv: int) -> list[Transition] | None:
        """The transitions a client whose state is the slice's at resourceVersion ``rv`` may
        have missed: after the position of a LIST answered at ``rv`` (the earliest such),
        else those caused by changes after ``rv``. None when the history does not reach back
        that far (the caller answers 410)."""
        positions = [seq for lo, hi, seq in self._listed if lo <= rv <= hi]
        oldest = self._items[0].seq if self._items else self.seq + 1
        if positions:
            after = min(positions)
            if after + 1 < oldest:
                return None
            return [s.transition for s in self._items if s.seq > after]
        out = [s.transition for s in self._items if s.rv > rv]
        if len(self._items) == self._size and self._items[0].rv > rv:
            return None  # older transitions after rv may have been forgotten
        return out


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
        self.history = History()
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

    def listed(self, *, lowest: int, highest: int, seq: int) -> None:
        """A LIST of a claimed resource was answered at a resourceVersion between ``lowest``
        and ``highest``, from the index at position ``seq`` (:attr:`History.seq`, read before
        the answer was computed) or later."""
        self.history.listed(lowest=lowest, highest=highest, seq=seq)

    def since(self, rv: int) -> list[Transition] | None:
        """:meth:`History.since`."""
        return self.history.since(rv)

    def _publish(self, transitions: list[Transition], *, rv: int) -> None:
        self.history.add(transitions, rv=rv)
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
            self._publish(self.index.replace(entries, scope=source), rv=store.rv)
            self._synced[path].set()
            async for item in subscription:
                if not isinstance(item, Change):
                    continue  # a bookmark: nothing references anything new
                some = item.new or item.deleted or item.prev
                assert some is not None
                self._publish(
                    self.index.update(self._key(source, some), self._refs(source, item.new)),
                    rv=item.rv,
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
