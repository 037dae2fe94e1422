"""LIST and WATCH of a claimed resource (a Secret, a ConfigMap) from the shared watch cache.

A slice's claimed resources (:mod:`vwserver.related`) are read like the export's own: one
upstream list+watch of ``clusters/*/api/v1/secrets`` shared by every slice
(:class:`~vwserver.cache.shared.SharedResource`), every representation (objects,
PartialObjectMetadata, Tables) and the same query semantics as :mod:`vwserver.proxy.cached`.
Membership is the slice's rules for the resource (:meth:`~vwserver.related.ClaimedView.sees`,
through :attr:`ProxyRequest.member`): a label selector, or the slice's live reference index.
A LIST therefore needs nothing new (:func:`vwserver.proxy.cached.list_page` asks the same
membership); it only tells the reference index which index position its answer reflects, so
that a watch from the LIST's resourceVersion can be given what happened after it.

A WATCH is different, because a claimed object's visibility changes without any change of the
object: a visible database starts (stops) naming a Secret. The watch listens to the slice's
reference index (:meth:`~vwserver.cache.related_index.SliceReferences.listen`) and turns each
transition into an event from the cache — the Secret as the cache holds it — so a reference
change costs no upstream request. The watch keeps the set of objects its client holds
(:class:`ClaimedWatch`; only visible claimed objects in the client's scope, few), and every
item — an upstream change of the resource, a reference transition — brings the client's copy
of that one object in line with what the slice shows now: ADDED for an object that became
visible, MODIFIED for one still visible, DELETED (its last version the client could see) for
one it holds that is no longer visible, nothing otherwise. So an event names only an object
that is visible through the slice or was until then — the existence rules of every other watch.

Order: a transition is emitted after every change of the resource the fan-out had queued for
this watch when the transition happened (the subscription's queue depth then), carrying the
cache's version of the object at that moment — the version those changes end at — so a
client's copy never goes back to an older version. A transition whose object is not in the
cache yet (a Secret created just now, its event still on the way) sends nothing: the object's
own ADDED follows and is decided with the index as it is then.

A watch from a resourceVersion (after a LIST) replays what the client may have missed: the
resource's changes since then from the cache's window, and the index's transitions since the
LIST (:meth:`~vwserver.cache.related_index.SliceReferences.since`) — collapsed into one event
per object that changed, as a relist would; 410 Expired (the client relists) when either no
longer reaches back that far.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Iterable
from typing import Final, Protocol

from aiohttp import web

from vwserver.cache.entries import Change, Entry, Key
from vwserver.cache.related_index import SliceReferences
from vwserver.cache.shared import Bookmark, SharedResource, Subscription
from vwserver.cache.store import Expired as WindowExpired
from vwserver.cache.table_resource import SharedTable
from vwserver.cache.views import ClientFilter, SliceView, accepts, departed, seen
from vwserver.proxy import cached, cached_tables
from vwserver.proxy.cache_plan import Consistency, ListPlan, WatchPlan
from vwserver.proxy.context import ProxyRequest
from vwserver.related import Transition

__all__ = ["ClaimedWatch", "serve_claimed_list", "serve_claimed_watch"]

log = logging.getLogger(__name__)

TRANSITIONS: Final = 1024
"""Reference transitions one watch may have waiting; beyond, the watch ends (its client
re-watches)."""

Event = tuple[str, Entry, Change | None]
"""An event to send: its type, the entry it carries, and the change it comes from (None: a
reference transition or the watch's start)."""


# --------------------------------------------------------------------------------------------
# LIST


async def serve_claimed_list(
    ctx: ProxyRequest, resource: SharedResource, plan: ListPlan
) -> web.StreamResponse:
    """A LIST of the claimed resource from the cache (objects, PartialObjectMetadata or a
    Table, as ``resource`` is); the slice's reference index learns which of its positions the
    answer reflects (read before the answer, so it is that position or a later one)."""
    references = ctx.references
    seq = references.history.seq if references is not None else 0
    lowest = resource.store.rv
    if plan.consistency is Consistency.EXACT and plan.rv:
        lowest = min(lowest, plan.rv)
    if isinstance(resource, SharedTable):
        response = await cached_tables.serve_table_list(ctx, resource, plan)
    else:
        response = await cached.serve_cached_list(ctx, resource, plan)
    if references is not None:
        references.listed(lowest=lowest, highest=resource.store.rv, seq=seq)
    return response


# --------------------------------------------------------------------------------------------
# WATCH: the pure part


class ClaimedWatch:
    """What one watch of a claimed resource sends (see the module docstring): the objects its
    client holds, and per item the events that bring one object in line with the slice."""

    def __init__(
        self, store_get: _Getter, *, view: SliceView, client: ClientFilter, held: Iterable[Key]
    ) -> None:
        self._get = store_get
        self._view = view
        self._client = client
        self.held: set[Key] = set(held)
        """The objects the client holds (as this watch and its start told it)."""

    def _shows(self, entry: Entry) -> bool:
        return seen(self._view, self._client, entry.meta)

    def change(self, change: Change) -> list[Event]:
        """An upstream change of the resource."""
        key = change.key
        had = key in self.held
        new = change.new
        if new is not None and self._shows(new):
            self.held.add(key)
            return [("MODIFIED" if had else "ADDED", new, change)]
        if had:
            self.held.discard(key)
            if change.prev is None:  # the client's copy came from a transition: say that one
                gone = change.new or change.deleted
                assert gone is not None
                return [("DELETED", gone, None)]
            return [("DELETED", departed(change), change)]
        return []

    def transition(self, key: Key, version: Entry | None) -> list[Event]:
        """The object ``key`` became visible or invisible by reference (or may have);
        ``version``: the cache's version of it when that happened — the last one its changes
        before the transition brought (a later change is decided after it). None, not in the
        cache: nothing — a creation the stream has not delivered yet comes as its own ADDED,
        decided with the index as it is then."""
        if version is None:
            return []
        had = key in self.held
        if self._shows(version):
            if had:
                return []
            self.held.add(key)
            return [("ADDED", version, None)]
        if not had:
            return []
        self.held.discard(key)
        return [("DELETED", version, None)]

    def catch_up(
        self, changes: list[Change], transitions: list[Transition], *, claim: tuple[str, str]
    ) -> list[Event]:
        """A watch from a resourceVersion R: the client's state is what the slice showed at R
        (a LIST's), ``held`` was set to what it shows now, ``changes`` and ``transitions``
        are what happened since. Every object they touched is brought in line once: ADDED when
        it is visible now (the client may hold it already: client-go's informer takes an ADDED
        of an object it has as an update), DELETED when it was visible at R and is not now.
        Visible at R: its version then (before its first change since, else the current one)
        matched the client and a selector rule, or a reference named it then (before its first
        transition since, the opposite of that transition; else as the index says now). An
        object that became visible and invisible again since R, or was named while it did not
        exist, is no business of this client: nothing."""
        claimed = self._view.claimed
        assert claimed is not None
        at_r: dict[Key, Entry | None] = {}
        last: dict[Key, Entry | None] = {}
        for change in changes:
            key = change.key
            at_r.setdefault(key, change.prev)
            last[key] = change.new or change.deleted or change.prev
        named_at_r: dict[Key, bool] = {}
        for t in transitions:
            if t.claim == claim:
                named_at_r.setdefault(t.key, not t.visible)
        out: list[Event] = []
        for key in [*last, *(k for k in named_at_r if k not in last)]:
            current = self._get(key)
            if current is not None and self._shows(current):
                self.held.add(key)
                out.append(("ADDED", current, None))
                continue
            self.held.discard(key)
            then = at_r.get(key, current)
            if then is None or not self._client.matches(then.meta):
                continue
            named = named_at_r.get(key)
            if named is None:
                named = claimed.index is not None and claimed.index.referenced(claim, key)
            selected = any(
                r.selector is not None and r.selector.matches(then.meta.labels)
                for r in claimed.rules
            )
            if named or selected:
                out.append(("DELETED", current or last.get(key) or then, None))
        return out


class _Getter(Protocol):
    def __call__(self, key: Key, /) -> Entry | None: ...


# --------------------------------------------------------------------------------------------
# WATCH: lines in the negotiated representation


class _Lines(Protocol):
    def event(self, kind: str, entry: Entry, change: Change | None) -> bytes: ...

    def bookmark(self, rv: int, *, initial_events_end: bool) -> bytes: ...


class _ObjectLines:
    def __init__(self, enc: cached._Encoder) -> None:
        self._enc = enc

    def event(self, kind: str, entry: Entry, change: Change | None) -> bytes:
        return self._enc.event(kind, entry.raw)

    def bookmark(self, rv: int, *, initial_events_end: bool) -> bytes:
        return self._enc.bookmark(rv, initial_events_end=initial_events_end)


class _TableLines:
    def __init__(self, watch: cached_tables._TableWatch) -> None:
        self._watch = watch

    def event(self, kind: str, entry: Entry, change: Change | None) -> bytes:
        w = self._watch
        row = w.printer.row(cached_tables._row(entry, change), entry.raw, w.resource.now())
        return w.printer.event(kind, row, entry.meta.resource_version, headers=w._first())

    def bookmark(self, rv: int, *, initial_events_end: bool) -> bytes:
        return self._watch.bookmark(rv, initial_events_end=initial_events_end)


def _lines(
    ctx: ProxyRequest,
    resource: SharedResource,
    plan: WatchPlan,
    *,
    view: SliceView,
    client: ClientFilter,
) -> _Lines:
    if isinstance(resource, SharedTable):
        printer = cached_tables._printer(
            ctx, resource, bookmarks=plan.bookmarks or plan.initial_events_end
        )
        watch = cached_tables._TableWatch(
            resource, printer, view=view, client=client, bookmarks=plan.bookmarks
        )
        return _TableLines(watch)
    return _ObjectLines(cached._encoder(ctx, resource))


# --------------------------------------------------------------------------------------------
# WATCH: I/O


class _Transitions:
    """The reference transitions of one watch's claimed resource, each with the number of
    the subscription's items that were queued before it (they are sent first) and the cache's
    version of the object then."""

    def __init__(self, subscription: Subscription, claim: tuple[str, str], get: _Getter) -> None:
        self._subscription = subscription
        self._get = get
        self._claim = claim
        self.popped = 0
        """Items taken from the subscription so far."""
        self.waiting: collections.deque[tuple[int, Key, Entry | None]] = collections.deque()
        self.arrived = asyncio.Event()
        self.overflowed = False

    def __call__(self, transitions: list[Transition]) -> None:
        after = self.popped + self._subscription.depth
        for t in transitions:
            if t.claim != self._claim:
                continue
            if len(self.waiting) >= TRANSITIONS:
                self.overflowed = True
                self._subscription.close()
                return
            self.waiting.append((after, t.key, self._get(t.key)))
        self.arrived.set()

    async def next_item(self) -> Change | Bookmark:
        item = await self._subscription.__anext__()
        self.popped += 1
        return item


async def serve_claimed_watch(
    ctx: ProxyRequest, resource: SharedResource, plan: WatchPlan
) -> web.StreamResponse:
    """A WATCH of the claimed resource from the cache (see the module docstring)."""
    claimed = ctx.claimed
    assert claimed is not None
    view = ctx.member
    client = cached.client_filter(ctx)
    await cached.ready(ctx, resource, plan.consistency, plan.rv, watch=True)
    lines = _lines(ctx, resource, plan, view=view, client=client)
    references: SliceReferences | None = ctx.references
    store = resource.store
    # From here to the subscription and the listener nothing awaits: every change and every
    # transition is in the start, or comes after it.
    accept = accepts(view, client)
    visible = [e for e in store.snapshot() if accept(e)]
    watch = ClaimedWatch(store.get, view=view, client=client, held=(e.key for e in visible))
    start: list[Event] = []
    expired = ""
    if plan.changes_after is None:
        start = [("ADDED", e, None) for e in visible]
        from_rv = store.rv
    else:
        since = plan.changes_after
        from_rv = max(since, store.rv)
        try:
            changes = store.changes_since(since) if since < store.rv else []
        except WindowExpired:
            changes = []
            expired = f"too old resource version: {since} ({store.oldest_rv})"
        missed = references.since(since) if references is not None else []
        if missed is None:
            expired = f"too old resource version: {since} (the slice's references)"
        elif not expired:
            start = watch.catch_up(changes, missed, claim=claimed.claim)
    subscription: Subscription | None = None
    if not expired:
        subscription = resource.subscribe(from_rv=from_rv, queue_size=cached.QUEUE_SIZE)
    pending = (
        _Transitions(subscription, claimed.claim, store.get) if subscription is not None else None
    )
    undo = references.listen(pending) if references is not None and pending is not None else None
    try:
        response, streaming = await cached.open_watch(
            ctx,
            cached.WatchStart(initial=[], rv=from_rv, subscription=subscription, expired=expired),
        )
        if streaming is None or pending is None:
            return response
        return await cached.stream_watch(
            response,
            initial=(lines.event(k, e, c) for k, e, c in start),
            end=(lambda: lines.bookmark(from_rv, initial_events_end=True))
            if plan.initial_events_end
            else None,
            stream=lambda: _stream(ctx, response, streaming, pending, watch, lines, plan=plan),
        )  # the subscription is closed below, however the watch ends
    finally:
        if undo is not None:
            undo()
        if subscription is not None:
            subscription.close()  # idempotent; also when the client left before the headers


async def _stream(
    ctx: ProxyRequest,
    response: web.StreamResponse,
    subscription: Subscription,
    pending: _Transitions,
    watch: ClaimedWatch,
    lines: _Lines,
    *,
    plan: WatchPlan,
) -> None:
    """Changes and transitions, in order, until the subscription ends (timeout, retirement,
    shutdown, overflow, relist: :func:`vwserver.proxy.cached.watch_lifetime`)."""
    processed = 0
    item: asyncio.Task[Change | Bookmark] | None = None
    arrived: asyncio.Task[bool] | None = None
    with cached.watch_lifetime(ctx, subscription, seconds=plan.timeout):
        try:
            while True:
                out: list[bytes] = []
                while pending.waiting and pending.waiting[0][0] <= processed:
                    _, key, version = pending.waiting.popleft()
                    events = watch.transition(key, version)
                    out.extend(lines.event(k, e, c) for k, e, c in events)
                if out:
                    await response.write(b"".join(out))
                if item is None:
                    item = asyncio.ensure_future(pending.next_item())
                if arrived is None:
                    pending.arrived.clear()
                    if pending.waiting and pending.waiting[0][0] <= processed:
                        continue
                    arrived = asyncio.ensure_future(pending.arrived.wait())
                await asyncio.wait({item, arrived}, return_when=asyncio.FIRST_COMPLETED)
                if arrived.done():
                    arrived = None
                if not item.done():
                    continue
                try:
                    got = item.result()
                except StopAsyncIteration:
                    break
                finally:
                    item = None
                processed += 1
                if isinstance(got, Bookmark):
                    if plan.bookmarks:
                        await response.write(lines.bookmark(got.rv, initial_events_end=False))
                    continue
                events = watch.change(got)
                if events:
                    await response.write(b"".join(lines.event(k, e, c) for k, e, c in events))
        finally:
            for task in (item, arrived):
                if task is not None:
                    task.cancel()
    if subscription.overflowed or pending.overflowed:
        log.info("watch on %s ended: the client fell behind", ctx.api.resource)
