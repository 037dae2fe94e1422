"""LIST and WATCH of Tables from the shared watch cache: ``kubectl get`` and ``kubectl get -w``.

A Table is one more representation of the slice's view, computed from the same cache the
other representations come from: the rows of :class:`~vwserver.cache.table_resource.
SharedTable` are keyed, paged, filtered (:func:`vwserver.cache.views.visible` on each row's
object metadata, then the client's own selectors) and turned into watch events exactly like the
object cache's entries (:func:`~vwserver.proxy.cached.list_page`,
:func:`~vwserver.cache.views.transition`); only the printing differs. Cells are kcp's, except
``date`` cells, printed anew at response time (:mod:`vwserver.cache.tables`); the row's object
is the object as the slice shows it, as ``includeObject`` asks.

A Table watch follows the apiserver's Table watch, as kcp sends it: every event (BOOKMARK
included) is a Table with one row, its ``metadata.resourceVersion`` the object's; only the
first event carries the column definitions (``null`` after); ERROR events carry a Status.

The cache declines (:class:`~vwserver.proxy.cached.Fallback`: kcp answers) when it cannot print
exactly: a ``date`` column whose source it does not know, or a bookmark with
``includeObject=Object`` before it has seen any object of the kind. Table watches are few (people
running ``kubectl get -w``), so a Table watch writes its own events from its queue; the
fan-out's direct writing is for the informers' object watches.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime

from aiohttp import web

from vwserver.cache.entries import Change, Entry
from vwserver.cache.shared import Bookmark, Subscription
from vwserver.cache.table_resource import SharedTable
from vwserver.cache.tables import INCLUDE_METADATA, INCLUDE_OBJECT, Row, TablePrinter
from vwserver.cache.views import ClientFilter, SliceView, leaving, transition
from vwserver.holds import as_leaving
from vwserver.proxy.cache_plan import ListPlan, WatchPlan
from vwserver.proxy.cached import (
    Fallback,
    client_filter,
    list_page,
    open_watch,
    ready,
    shown,
    start_watch,
    stream_watch,
    watch_lifetime,
    write_lines,
)
from vwserver.proxy.context import ProxyRequest
from vwserver.proxy.filtering import LIST_FOOTER, list_opening
from vwserver.proxy.responses import prepare_list

__all__ = ["serve_table_list", "serve_table_watch"]

log = logging.getLogger(__name__)


def _printer(ctx: ProxyRequest, resource: SharedTable, *, bookmarks: bool) -> TablePrinter:
    """How this request's Table is printed; :class:`Fallback` when the cache cannot print it
    exactly (``bookmarks``: the response may carry bookmarks)."""
    columns = resource.columns
    if columns.unknown is not None:
        raise Fallback(f"Table of {ctx.api.resource} from kcp: {columns.unknown}")
    include = ctx.options.get("includeObject") or INCLUDE_METADATA
    if include == INCLUDE_OBJECT and bookmarks and not resource.kind:
        raise Fallback(f"Table of {ctx.api.resource} from kcp: its kind is not known yet")
    return TablePrinter(
        version=ctx.representation.version,
        include=include,
        columns=columns,
        object_api_version=resource.api_version,
        object_kind=resource.kind,
    )


def _row(entry: Entry, change: Change | None = None) -> Row:
    """The row whose cells print ``entry``: the entry itself, or — for a DELETED carrying the
    previous version at the change's resourceVersion (:func:`vwserver.cache.views.departed`)
    — that previous version's row."""
    if isinstance(entry, Row):
        return entry
    source = change.prev if change is not None else None
    assert isinstance(source, Row), "a Table resource stores rows only"
    return source


# --------------------------------------------------------------------------------------------
# LIST


async def serve_table_list(
    ctx: ProxyRequest, resource: SharedTable, plan: ListPlan
) -> web.StreamResponse:
    entries, rv, token = await list_page(ctx, resource, plan)
    printer = _printer(ctx, resource, bookmarks=False)
    view = ctx.member
    head = list_opening(
        kind="Table",
        api_version=printer.api_version,
        resource_version=str(rv),
        continue_token=token,
        column_definitions=printer.columns.raw,
    )
    now = resource.now()
    response = web.StreamResponse(status=200)
    response.content_type = "application/json"
    if not await prepare_list(ctx.request, response):
        return response
    await response.write(head)
    rows = (printer.row(_row(e), shown(view, e), now) for e in entries)
    await write_lines(response, _joined(rows))
    await response.write(LIST_FOOTER)
    await response.write_eof()
    return response


def _joined(rows: Iterator[bytes]) -> Iterator[bytes]:
    """Rows separated by commas (written in batches by :func:`write_lines`)."""
    for index, row in enumerate(rows):
        yield row if index == 0 else b"," + row


# --------------------------------------------------------------------------------------------
# WATCH


class _TableWatch:
    """The lines of one Table watch: the first carries the column definitions."""

    def __init__(
        self,
        resource: SharedTable,
        printer: TablePrinter,
        *,
        view: SliceView,
        client: ClientFilter,
        bookmarks: bool,
    ) -> None:
        self.resource = resource
        self.printer = printer
        self.view = view
        self.client = client
        self.bookmarks = bookmarks
        self.headers = True
        """Nothing sent yet: the next event carries the column definitions."""
        self._memo = f"table/{printer.version}/{printer.include}"

    def _first(self) -> bool:
        headers, self.headers = self.headers, False
        return headers

    def added(self, entry: Entry, now: datetime) -> bytes:
        row = self.printer.row(_row(entry), shown(self.view, entry), now)
        return self.printer.event("ADDED", row, entry.meta.resource_version, headers=self._first())

    def bookmark(self, rv: int, *, initial_events_end: bool) -> bytes:
        return self.printer.bookmark(
            rv, initial_events_end=initial_events_end, headers=self._first()
        )

    def line(self, item: Change | Bookmark) -> bytes | None:
        """What ``item`` sends to this client (None: nothing)."""
        if isinstance(item, Bookmark):
            return self.bookmark(item.rv, initial_events_end=False) if self.bookmarks else None
        events = transition(view=self.view, client=self.client, change=item)
        if not events:
            return None
        now = self.resource.now()
        leaves = [leaving(self.view, entry.meta) for _, entry in events]
        # Every client that prints this change the same way sends the same bytes: print once
        # per representation (per slice for an object leaving it; per second of printing time
        # when there are date cells) — except a watch's first event, which has the columns.
        # A DELETED and an ADDED (a leave that completed) are one line pair.
        memo = f"{self._memo}/{'+'.join(kind for kind, _ in events)}"
        if any(since is not None for since in leaves):
            memo += f"/{self.view.id}"
        if self.printer.columns.dates:
            memo += f"@{int(now.timestamp())}"
        first = self._first()
        line = None if first else item.lines.get(memo)
        if line is None:
            parts = []
            for index, ((kind, entry), since) in enumerate(zip(events, leaves, strict=True)):
                raw = entry.raw if since is None else as_leaving(entry.raw, since)
                row = self.printer.row(_row(entry, item), raw, now)
                version = entry.meta.resource_version
                parts.append(self.printer.event(kind, row, version, headers=first and index == 0))
            line = b"".join(parts)
            if not first:
                item.lines[memo] = line
        return line


async def serve_table_watch(
    ctx: ProxyRequest, resource: SharedTable, plan: WatchPlan
) -> web.StreamResponse:
    view = ctx.member
    client = client_filter(ctx)
    await ready(ctx, resource, plan.consistency, plan.rv, watch=True)
    printer = _printer(ctx, resource, bookmarks=plan.bookmarks or plan.initial_events_end)
    watch = _TableWatch(resource, printer, view=view, client=client, bookmarks=plan.bookmarks)
    start = start_watch(resource, plan, view=view, client=client)
    response, subscription = await open_watch(ctx, start)
    if subscription is None:
        return response
    now = resource.now()
    return await stream_watch(
        response,
        initial=(watch.added(e, now) for e in start.initial),
        end=(lambda: watch.bookmark(start.rv, initial_events_end=True))
        if plan.initial_events_end
        else None,
        stream=lambda: _stream(ctx, response, subscription, watch, lifetime=plan.timeout),
        done=subscription.close,
    )


async def _stream(
    ctx: ProxyRequest,
    response: web.StreamResponse,
    subscription: Subscription,
    watch: _TableWatch,
    *,
    lifetime: int,
) -> None:
    """Live changes until the subscription ends: the watch's timeout, the route's retirement
    and the server's shutdown close it; the cache ends it when the client fell behind or the
    cache relisted (also when kcp's printer columns changed)."""
    with watch_lifetime(ctx, subscription, seconds=lifetime):
        async for item in subscription:
            line = watch.line(item)
            if line:
                await response.write(line)
    if subscription.overflowed:
        log.info("Table watch on %s ended: the client fell behind", ctx.api.resource)
