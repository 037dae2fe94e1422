"""One upstream list+watch per resource, fanned out to every client in process.

A :class:`SharedResource` follows one collection of the upstream — ``<virtual workspace>/
clusters/*/<api path>``, without a selector, with vwserver's own identity — through a
:class:`~vwserver.k8s.reflector.RawReflector` (the project's one list+watch loop: resume from the
last resourceVersion, relist on 410, bookmarks, backoff with jitter). Each object is decoded
once, into an :class:`~vwserver.cache.entries.Entry` (its bytes and its metadata), and kept in a
:class:`~vwserver.cache.store.Store`. Every watch of every slice on that resource is a
:class:`Subscription` to it: a thousand informers are one upstream watch.

The fan-out follows the apiserver's cacher:

* **No gap between the past and the live stream.** :meth:`SharedResource.subscribe` registers
  the subscription and reads the window's changes since the client's resourceVersion in one
  step (nothing awaits in between, and the reflector's handlers run on the same loop), so every
  change is either in the backlog or in the queue, never in neither or both.
* **A slow client never blocks anyone.** The reflector hands a change to every subscription
  with a non-blocking append onto a bounded queue; a subscription whose queue is full is ended
  (``overflowed``) — the cacher terminates a watcher that cannot keep up, and client-go
  re-watches from the last resourceVersion it received (from the window, or with a relist if
  that has left it).
* **A client that keeps up costs no wake-up.** Waking one coroutine per watcher for every
  change is what a fan-out to a thousand watchers spends most of its time on. A consumer that
  waits with nothing queued may attach a :class:`DirectWriter`: the fan-out hands it the change
  synchronously (it writes to the client's connection if that has nothing unsent, or declines),
  and only a declined change goes through the queue and wakes the consumer. What a writer
  took is flushed once per turn of the event loop (:meth:`DirectWriter.flush`), so a burst of
  changes is one write per client. Order holds because a change is offered to the writer only
  while the consumer waits with an empty queue and backlog: once one change is queued, every
  later one is queued too until the consumer has written them and waits again.
* **A relist ends every watch** (``relisted``): after a 410 upstream the changes in between are
  unknown, so no watch can be continued exactly; the cacher terminates all watchers too.
* **Bookmarks**: every upstream bookmark at or beyond the store's resourceVersion reaches every
  subscription as :class:`Bookmark` — also one that only confirms the last change, so that a
  client that filtered that change out learns its progress (the latest bookmark replaces one
  still queued; a full queue skips it — the next change carries the progress anyway).
* **Consistent reads** wait for the store to reach a resourceVersion read upstream
  (:meth:`SharedResource.wait_for`); bookmarks advance it while nothing changes, and a read that
  found kcp ahead asks the reflector for them (:meth:`SharedResource.upstream_at`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
from asyncio import FIRST_COMPLETED
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, cast

import msgspec

from vwserver.cache.entries import Change, ChangeType, Entry, Interner, Key, entry
from vwserver.cache.store import Store
from vwserver.clock import Clock
from vwserver.k8s import kcp
from vwserver.k8s.backoff import Backoff
from vwserver.k8s.client import KubeClient
from vwserver.k8s.reflector import RawReflector
from vwserver.metrics import ServerMetrics

__all__ = ["Bookmark", "DirectWriter", "SharedResource", "Subscription"]

log = logging.getLogger(__name__)

WRITTEN_MAX: Final = 1024
"""Write answers a resource keeps until its stream delivers them (:meth:`SharedResource.wrote`)."""

# Why a subscription ended (Subscription.ended).
CLOSED: Final = "closed"  # its consumer closed it
OVERFLOWED: Final = "overflowed"  # its queue was full when a change arrived
RELISTED: Final = "relisted"  # the resource relisted: the changes in between are unknown
STOPPED: Final = "stopped"  # the resource stopped (idle, or vwserver shuts down)


@dataclass(frozen=True, slots=True)
class Bookmark:
    """The store reached ``rv`` without a change for this subscription to receive. One
    upstream bookmark is one object for every subscription it reaches."""

    rv: int
    lines: dict[str, bytes] = field(default_factory=dict, compare=False, repr=False)
    """Memo of encoded lines shared by every client that sends it the same way (as
    :attr:`~vwserver.cache.entries.Change.lines`)."""


Item = Change | Bookmark


class DirectWriter(Protocol):
    """Writes a subscription's items to its client from the fan-out itself, while the consumer
    waits with nothing queued (see the module docstring). Called synchronously, on the loop."""

    def take(self, item: Item) -> bool:
        """Send ``item`` (or decide that this client sends nothing for it); False when the
        client cannot take it now (its connection has unsent bytes, or is closing): the item
        then goes through the queue, and the consumer writes it with backpressure."""
        ...

    def flush(self) -> None:
        """Write what :meth:`take` accepted in this turn of the event loop."""
        ...

    def ended(self) -> None:
        """The subscription ended while its consumer was not waiting for items (it may be
        blocked writing to a client that does not read)."""
        ...


class Subscription:
    """One client's stream of a shared resource: the window's changes after ``from_rv``, then
    live changes and bookmarks, until it is ended (:attr:`ended` says why). Iterate it; the
    iteration stops, without a further item, as soon as it is ended."""

    __slots__ = (
        "_backlog",
        "_direct",
        "_next",
        "_owner",
        "_queue",
        "_waiter",
        "ended",
        "from_rv",
        "max_depth",
        "queue_size",
    )

    def __init__(
        self, *, owner: SharedResource, from_rv: int, queue_size: int, backlog: list[Change]
    ) -> None:
        if queue_size < 1:
            raise ValueError("a subscription's queue holds at least one change")
        self.from_rv = from_rv
        self.queue_size = queue_size
        self.ended: str | None = None
        """None while it runs; then why it ended: closed, overflowed, relisted or stopped."""
        self.max_depth = 0
        """The longest its queue has been."""
        self._owner = owner
        self._backlog = backlog
        self._next = 0
        # Created on first use: a watcher whose writer takes every change never queues one.
        self._queue: collections.deque[Item] | None = None
        self._waiter: asyncio.Future[None] | None = None
        """Set while the consumer waits in ``__anext__`` with nothing to read."""
        self._direct: DirectWriter | None = None

    @property
    def overflowed(self) -> bool:
        return self.ended == OVERFLOWED

    @property
    def relisted(self) -> bool:
        return self.ended == RELISTED

    @property
    def stopped(self) -> bool:
        return self.ended == STOPPED

    @property
    def depth(self) -> int:
        """Live items waiting in the queue (the backlog is the window's, not counted)."""
        return len(self._queue) if self._queue is not None else 0

    def attach(self, writer: DirectWriter | None) -> None:
        """Let the fan-out hand items to ``writer`` while the consumer waits with nothing
        queued (None: every item through the queue again)."""
        self._direct = writer

    def close(self) -> None:
        """Stop receiving (idempotent)."""
        self._end(CLOSED)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Item:
        while True:
            if self.ended is not None:
                raise StopAsyncIteration
            if self._next < len(self._backlog):
                change = self._backlog[self._next]
                self._next += 1
                return change
            if self._queue:
                return self._queue.popleft()
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    # --- called by the owner (synchronously, from the reflector's handlers) ----------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _offer(self, change: Change) -> bool:
        """Queue ``change``; False if the queue is full (the caller ends the subscription)."""
        queue = self._queue
        if queue is None:
            queue = self._queue = collections.deque()
        elif len(queue) >= self.queue_size:
            return False
        queue.append(change)
        if len(queue) > self.max_depth:
            self.max_depth = len(queue)
        self._wake()
        return True

    def _offer_bookmark(self, bookmark: Bookmark) -> None:
        queue = self._queue
        if queue is None:
            queue = self._queue = collections.deque()
        if queue and isinstance(queue[-1], Bookmark):
            queue[-1] = bookmark
        elif len(queue) < self.queue_size:
            queue.append(bookmark)
        else:
            return
        self._wake()

    def _end(self, reason: str) -> None:
        if self.ended is not None:
            return
        self.ended = reason
        if self._queue is not None:
            self._queue.clear()
        self._backlog = []
        direct, self._direct = self._direct, None
        if direct is not None and self._waiter is None:
            direct.ended()
        self._wake()
        self._owner._detach(self)


def _entry_rv(item: Entry) -> int:
    return item.meta.resource_version


class SharedResource:
    """One upstream collection (``upstream`` virtual workspace, ``api_path`` such as
    ``/apis/example.io/v1alpha1/widgets``) mirrored in a :class:`Store` for every client.

    :meth:`start` it (or await :meth:`run`); :meth:`stop` ends it and every subscription.
    """

    def __init__(
        self,
        *,
        client: KubeClient,
        clock: Clock,
        upstream: str,
        api_path: str,
        window: int = 4096,
        page_size: int = 500,
        watch_timeout: int = 300,
        backoff: Backoff | None = None,
        metrics: ServerMetrics | None = None,
        rand: Callable[[], float] = random.random,
        table: bool = False,
    ) -> None:
        if not api_path.startswith(("/api/", "/apis/")):
            raise ValueError(f"not an API collection path: {api_path!r}")
        self.upstream = upstream.rstrip("/")
        self.api_path = api_path
        self.table = table
        """The collection as ``meta.k8s.io`` Table rows (:mod:`vwserver.cache.table_resource`)
        instead of objects: the reflector's table mode, ``_decode`` gets rows."""
        self.url = kcp.clusters(self.upstream) + api_path
        self.store = Store(window=window)
        self.users = 0
        """Holders of this resource (:class:`~vwserver.cache.registry.CacheRegistry` counts)."""
        self.on_idle: Callable[[SharedResource], None] | None = None
        """Told when the last subscription ends while nobody holds the resource."""
        self._metrics = metrics
        self._interner = Interner()
        self._reflector: RawReflector[Entry] = RawReflector(
            name=f"cache {self.url}",
            client=client,
            url=self.url,
            handler=self,
            decode=self._decode,
            version=_entry_rv,
            clock=clock,
            page_size=page_size,
            watch_timeout=watch_timeout,
            backoff=backoff,
            on_restart=self._restarted,
            rand=rand,
            table=table,
        )
        self._subscriptions: dict[Subscription, None] = {}  # insertion-ordered set
        self._taken: list[DirectWriter] = []
        """Writers that took items in this turn of the event loop, to flush at its end."""
        self._flush_handle: asyncio.Handle | None = None
        self._synced = asyncio.Event()
        self._failed = asyncio.Event()
        """Set when a list or watch failed before the first list completed."""
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        # A resourceVersion kcp had reached when the stream had not (see behind_upstream).
        self._upstream_ahead = 0
        # Versions kcp answered the proxy's writes with, until the stream delivers them (latest).
        self._written: dict[Key, Entry] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    # --- what the proxy reads -------------------------------------------------------------------

    @property
    def last_error(self) -> str | None:
        """Why the last upstream list or watch failed (None after a success)."""
        return self._reflector.last_error

    @property
    def synced(self) -> bool:
        return self.store.synced

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def list_kind(self) -> str:
        """The upstream list's ``kind`` (e.g. ``WidgetList``); empty before the first list."""
        return self._reflector.list_kind

    @property
    def kind(self) -> str:
        """The objects' ``kind``: the list's without ``List``."""
        return self.list_kind.removesuffix("List")

    @property
    def api_version(self) -> str:
        return self._reflector.api_version

    @property
    def subscribers(self) -> int:
        return len(self._subscriptions)

    @property
    def idle(self) -> bool:
        """Nobody holds it and nobody is subscribed."""
        return self.users <= 0 and not self._subscriptions

    async def wait_synced(self, timeout: float) -> bool:  # noqa: ASYNC109 - a bound, not a deadline
        """Whether the first list completed within ``timeout`` seconds; False as soon as it
        failed instead (:attr:`last_error` says why: a resource the upstream does not serve
        must not keep its readers waiting for the reflector's retries)."""
        if self._synced.is_set():
            return True
        if self._failed.is_set():
            return False
        synced = asyncio.ensure_future(self._synced.wait())
        failed = asyncio.ensure_future(self._failed.wait())
        try:
            await asyncio.wait([synced, failed], timeout=timeout, return_when=FIRST_COMPLETED)
        finally:
            for waiter in (synced, failed):
                waiter.cancel()
            await asyncio.gather(synced, failed, return_exceptions=True)
        return self._synced.is_set()

    async def wait_for(self, rv: int, *, timeout: float) -> bool:  # noqa: ASYNC109 - see above
        """Whether the store reached resourceVersion ``rv`` (by a change or a bookmark) within
        ``timeout`` seconds: for reads that must be at least as new as ``rv``."""
        if self.store.rv >= rv:
            return True
        if self._stopped:
            return False
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((rv, future))
        try:
            async with asyncio.timeout(timeout):
                await future
        except TimeoutError:
            pass
        finally:
            self._waiters = [(r, f) for r, f in self._waiters if f is not future]
        return self.store.rv >= rv

    @property
    def behind_upstream(self) -> bool:
        """Whether kcp is known to be at a resourceVersion this resource's stream has not
        reached (:meth:`upstream_at`): a consistent read cannot be proven until the stream gets
        there, which only its next event or bookmark does — so the read goes to kcp at once,
        without asking kcp's resourceVersion first (it can only be the same or newer)."""
        return self._upstream_ahead > self.store.rv

    def upstream_at(self, rv: int) -> None:
        """kcp's current resourceVersion was ``rv`` (a consistent read found it ahead of the
        stream): remembered until the stream reaches it, and the reflector asked for progress
        (:mod:`vwserver.k8s.progress`: short watches, whose pre-deadline bookmark brings the
        stream to ``rv`` within about 2 s instead of kcp's next periodic one, a minute away)."""
        self._upstream_ahead = max(self._upstream_ahead, rv)
        if self._upstream_ahead > self.store.rv:
            self._reflector.want_progress()

    @property
    def progress_wanted(self) -> bool:
        """Whether the reflector watches with short timeouts now (:meth:`upstream_at`)."""
        return self._reflector.progress_wanted

    def wrote(self, raw: bytes) -> None:
        """``raw``: the object as kcp answered a write through the proxy — newer than anything
        the stream has delivered until the stream reaches its resourceVersion. A controller's
        next write to the same object (a status patch after an update) is checked against it
        instead of the store's older version, whose resourceVersion kcp would refuse (409, a
        read and a write more). At most :data:`WRITTEN_MAX` are kept (the oldest go first)."""
        written = self._decode(msgspec.Raw(raw))
        if written.meta.resource_version <= self.store.rv:
            return  # the stream is there already: the store has it, or something newer
        self._written.pop(written.key, None)
        self._written[written.key] = written
        while len(self._written) > WRITTEN_MAX:
            del self._written[next(iter(self._written))]

    def latest(self, key: Key) -> Entry | None:
        """The newest version of ``key`` the proxy knows: a write's answer (:meth:`wrote`) the
        stream has not delivered yet, else the store's (None: the store does not have it)."""
        written = self._written.get(key)
        if written is not None:
            if written.meta.resource_version > self.store.rv:
                return written  # the store's version of it is older (at most store.rv)
            del self._written[key]  # the stream reached it: the store says (deleted since, too)
        return self.store.get(key)

    def subscribe(self, *, from_rv: int, queue_size: int) -> Subscription:
        """Every change after ``from_rv`` and then the live ones, through a queue of
        ``queue_size`` items. Raises :class:`~vwserver.cache.store.Expired` if ``from_rv`` is
        older than the window. On a stopped resource the subscription is ended at once."""
        subscription = Subscription(owner=self, from_rv=from_rv, queue_size=queue_size, backlog=[])
        if self._stopped:
            subscription.ended = STOPPED
            return subscription
        # Registered first, then the backlog read: no change can fall between the two.
        self._subscriptions[subscription] = None
        try:
            subscription._backlog = self.store.changes_since(from_rv)
        except BaseException:
            del self._subscriptions[subscription]
            raise
        return subscription

    def stats(self) -> dict[str, Any]:
        """For ``/metrics`` and ``/debug/cache``."""
        store = self.store
        return {
            "url": self.url,
            "objects": len(store),
            "raw_bytes": store.raw_bytes,
            "window": store.window_size,
            "window_capacity": store.capacity,
            "rv": store.rv,
            "oldest_rv": store.oldest_rv,
            "synced": store.synced,
            "last_error": self.last_error,
            "subscribers": len(self._subscriptions),
            "users": self.users,
            "max_queue_depth": max((s.depth for s in self._subscriptions), default=0),
        }

    # --- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        """Run the reflector in a task of its own (once)."""
        if self._task is None and not self._stopped:
            self._task = asyncio.create_task(self.run(), name=f"cache {self.url}")

    async def run(self) -> None:
        """List and watch until cancelled; then every subscription ends."""
        try:
            await self._reflector.run()
        finally:
            self._shutdown()

    async def stop(self) -> None:
        """Stop following the upstream; every subscription ends (``stopped``)."""
        self._stopped = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._shutdown()

    def _shutdown(self) -> None:
        self._stopped = True
        self._end_all(STOPPED)
        for _, future in self._waiters:
            if not future.done():
                future.set_result(None)

    # --- RawReflectorHandler: the upstream's list, events and bookmarks ---------------------------

    def on_list(self, items: list[Entry], resource_version: str) -> None:
        try:
            rv = int(resource_version)
        except ValueError:
            # A list without a resourceVersion is no apiserver's; its objects' newest is the
            # best lower bound of where it was taken.
            log.warning("%s: list without resourceVersion %r", self.url, resource_version)
            rv = max((item.meta.resource_version for item in items), default=0)
        self.store.replace(items, rv)
        self._end_all(RELISTED)
        self._synced.set()
        self._advanced()
        log.info("%s: %d objects at resourceVersion %d", self.url, len(items), rv)

    def on_event(self, kind: str, item: Entry) -> None:
        change = self.store.apply(cast(ChangeType, kind), item)
        if change is not None:
            overflowed: list[Subscription] = []
            rv = change.rv
            for subscription in self._subscriptions:
                if rv <= subscription.from_rv or self._took(subscription, change):
                    continue
                if not subscription._offer(change):
                    overflowed.append(subscription)
            for subscription in overflowed:
                log.info(
                    "%s: a watch fell %d changes behind: ended", self.url, subscription.queue_size
                )
                subscription._end(OVERFLOWED)
        self._advanced()

    def on_bookmark(self, resource_version: str) -> None:
        try:
            rv = int(resource_version)
        except ValueError:
            return
        advanced = rv > self.store.rv
        self.store.bookmark(rv)
        if rv < self.store.rv:
            return  # older than what the store has seen: says nothing new
        # Also at the store's rv: a client that filtered out the last changes learns that it
        # has everything up to here (where it resumes after a disconnect). A full queue skips
        # it (the next change carries the progress anyway).
        bookmark = Bookmark(rv)
        for subscription in self._subscriptions:
            if rv > subscription.from_rv and not self._took(subscription, bookmark):
                subscription._offer_bookmark(bookmark)
        if advanced:
            self._advanced()

    # --- internals ------------------------------------------------------------------------------

    def _took(self, subscription: Subscription, item: Item) -> bool:
        """Whether the subscription's writer took ``item`` (its consumer waits with nothing
        queued); the writer is flushed at the end of this turn of the event loop."""
        writer = subscription._direct
        if writer is None:
            return False
        waiter = subscription._waiter  # only a consumer that waits with nothing queued
        if waiter is None or waiter.done() or subscription._queue:
            return False
        try:
            took = writer.take(item)
        except Exception:
            # A writer's failure must not stop the fan-out to everyone else: this one goes
            # back to its queue, whose consumer meets the same failure itself.
            log.exception("%s: writing to a watch failed", self.url)
            subscription._direct = None
            return False
        if took:
            self._taken.append(writer)
            if self._flush_handle is None:
                self._flush_handle = asyncio.get_running_loop().call_soon(self._flush)
        return took

    def _flush(self) -> None:
        self._flush_handle = None
        taken, self._taken = self._taken, []
        for writer in taken:
            try:
                writer.flush()
            except Exception:
                log.exception("%s: writing to a watch failed", self.url)

    def _decode(self, raw: msgspec.Raw) -> Entry:
        return entry(raw, interner=self._interner)

    def _advanced(self) -> None:
        """Wake the readers waiting for a resourceVersion the store has reached."""
        if not self._waiters:
            return
        rv = self.store.rv
        for target, future in self._waiters:
            if target <= rv and not future.done():
                future.set_result(None)

    def _end_all(self, reason: str) -> None:
        for subscription in list(self._subscriptions):
            subscription._end(reason)

    def _detach(self, subscription: Subscription) -> None:
        if subscription in self._subscriptions:
            del self._subscriptions[subscription]
            if self._metrics is not None and subscription.ended in (OVERFLOWED, RELISTED):
                self._metrics.cache_watch_ended(url=self.url, reason=subscription.ended)
            if self.idle and self.on_idle is not None:
                self.on_idle(self)

    def _restarted(self, cause: str) -> None:
        if not self._synced.is_set():
            self._failed.set()
        if self._metrics is not None:
            self._metrics.cache_restarted(url=self.url, cause=cause)
