"""Filtered LIST: paged upstream, streamed out, every item checked.

Memory is bounded by one upstream page, never by the size of the list:

* a client that pages itself (``limit``/``continue``, as kubectl and client-go's pager do) gets
  exactly one upstream request per request, with its own limit and token, and the combined
  selector pushed down — the upstream's continue token stays valid because every page of that
  list carries the same selector;
* a client that asks for everything is served by the proxy paging upstream — ``listPageSize``
  first, then pages that double, bounded in objects and bytes (:func:`next_page_size`: kcp's
  cost grows with the number of pages) — and writing each page's matching items as soon as it
  has them, while the next page is read. The response is one list; its resourceVersion is the
  first page's, which is the snapshot every page is read at.

A slice that records holds cannot push its own selector down (an object it holds is in it
whatever its labels), so kcp's pages may hold little or nothing it sees. A client page is then
filled from further upstream pages, with bounded work (:func:`_fill`): after the client's own
page, the proxy asks for pages of at least ``listPageSize`` (never just the missing count, which
made ``limit=1`` cost one LIST per object kcp had to skip), and once the client's page holds an
entry it reads at most :data:`FILL_ROUNDS` pages in all, then answers with what it found — a
short page with a continue token, which the Kubernetes list contract allows and every pager
follows. The continue token is always kcp's own, from right after the last entry the client
got: kcp's tokens name the key of the entry they follow, and one after an object the slice does
not see would tell the client that it exists. So a client page never ends on such an object:
where it ends inside an upstream page, the proxy reads that page again up to there (the same
continue token with that count as the limit — a continue token reads the snapshot it was issued
at, so the same entries in the same order; the list's first page at its resourceVersion,
exactly) and hands out that read's token. And a page is never empty unless the list ended: up to
its first entry the proxy reads on, ``listPageSize`` objects per upstream page, which costs kcp
what listing those objects costs (as the apiserver fills a selector-filtered page). The proxy
mints no tokens of its own, so there is nothing a client could forge to make it skip or repeat
entries.

Items are forwarded as the bytes the upstream sent. If the upstream fails after the first bytes
went out, the connection is aborted rather than closed cleanly, so the client sees a broken
response, never a short list that looks complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

import msgspec
from aiohttp import web
from multidict import CIMultiDict

from vwserver import metrics as m
from vwserver.errors import BadGateway, UpstreamUnavailable
from vwserver.proxy import yamlout
from vwserver.proxy.context import ProxyRequest
from vwserver.proxy.filtering import (
    LIST_FOOTER,
    Page,
    UndecodableError,
    decode_page,
    list_fields,
    list_header,
    strip_row_object,
)
from vwserver.proxy.responses import (
    prepare_list,
    read_body,
    relay_whole,
    response_headers,
)
from vwserver.proxy.yamlout import YAML_CONTENT_TYPE
from vwserver.selector import Selector

log = logging.getLogger(__name__)

FILL_ROUNDS: Final = 3
"""Upstream pages read at most for one client page of a slice that records holds, once it holds
an entry: the client's own limit first, then pages of at least the page size."""
PAGE_BYTES: Final = 4 * 2**20
"""Bytes an upstream page of a LIST the proxy pages itself may grow to (at the bytes per object
of the page before): at most two pages are held at once (one written, the next read)."""
MAX_PAGE: Final = 10_000
"""Objects per upstream page at most, however small they are (the decoded metadata of a page
is held too)."""
MAX_UPSTREAM_PAGES: Final = FILL_ROUNDS + 1
"""Upstream LISTs one client page costs at most, beyond the pages of objects the slice does not
see before its first entry: the fill rounds, and one re-read of the beginning of the upstream
page the client's page ends in (for kcp's continue token after its last entry)."""


async def serve_list(ctx: ProxyRequest) -> web.StreamResponse:
    selector = ctx.effective_selector()
    headers = ctx.upstream_headers()
    client_pages = "limit" in ctx.options or "continue" in ctx.options
    extra: list[tuple[str, str]] = []
    if not client_pages:
        extra.append(("limit", str(ctx.page_size)))
        if ctx.options.get("resourceVersion") not in (None, "", "0") and not ctx.options.get(
            "resourceVersionMatch"
        ):
            # resourceVersion=N without a limit means "not older than N"; with the limit the
            # proxy adds it would mean "exactly N" (the apiserver's legacy paging rule): an
            # informer relisting at N after a 410 would get its old state again, and its
            # watch from N another 410, for as long as etcd keeps N.
            extra.append(("resourceVersionMatch", "NotOlderThan"))
    # A slice that records holds sees objects it holds whatever their labels: kcp is asked
    # with the client's selector only, and membership is decided here for every object.
    holds = ctx.records_holds
    client = ctx.client_selector()
    query = ctx.upstream_query(
        extra=extra, drop=() if client_pages else ("limit",), with_slice=not holds
    )
    first = await _first_page(ctx, query, headers)
    if isinstance(first, web.Response):
        return first
    url, query, page, response = first
    token = page.continue_token if client_pages else ""
    filled: list[bytes | msgspec.Raw] | None = None
    limit = int(ctx.options.get("limit") or 0)
    if holds and client_pages and limit:
        # kcp filled its page without the slice's selector: fill the client's page from a few
        # more upstream pages (as the apiserver fills a page with the objects its predicate
        # takes), bounded (see the module docstring).
        filled, token = await _fill(ctx, url, page, query, headers, limit=limit, client=client)
    writer = _ListWriter(
        page,
        continue_token=token,
        yaml=ctx.representation.yaml,
        strip_objects=ctx.strip_objects,
    )
    if ctx.representation.yaml:
        response.headers["Content-Type"] = YAML_CONTENT_TYPE
    if not await prepare_list(ctx.request, response):
        return response
    # Later pages must not repeat resourceVersion(Match): the apiserver refuses them together
    # with a continue token. Their limit is the proxy's (next_page_size).
    later = [
        (k, v) for k, v in query if k not in ("resourceVersion", "resourceVersionMatch", "limit")
    ]
    size = ctx.page_size
    following: asyncio.Task[Page] | None = None
    try:
        while True:
            if page.continue_token and not client_pages:
                # Fetch the next page while this one is filtered and written: the upstream's
                # work overlaps the proxy's, and at most two pages are held at once.
                size = next_page_size(size, page, floor=ctx.page_size)
                following = asyncio.ensure_future(
                    _fetch(
                        ctx,
                        url,
                        [*later, ("limit", str(size)), ("continue", page.continue_token)],
                        headers,
                    )
                )
                # A task runs only once this coroutine waits, and filtering and writing a page
                # may not wait at all (the client's socket takes it): let it send its request
                # now, or the upstream would start on the next page only after this one.
                await asyncio.sleep(0)
            visible: Sequence[bytes | msgspec.Raw]
            if filled is not None:
                visible = filled
            elif holds:
                visible = page.members(ctx.member, client)
            else:
                visible = page.visible(selector, ctx.member)
            if following is None:
                # The last entries, the list's end and the chunked body's end: one write.
                last = writer.entries(visible, last=True)
                break
            chunk = writer.entries(visible)
            if chunk:
                await response.write(chunk)
            page, following = await following, None
    except (BadGateway, UpstreamUnavailable, UndecodableError) as e:
        # Caught here, not in the handler: count it as the upstream error it is.
        kind = m.UNREACHABLE if isinstance(e, UpstreamUnavailable) else m.BAD_GATEWAY
        ctx.metrics.upstream_errors.labels(kind).inc()
        log.warning("list of %s aborted mid-stream: %s", ctx.api.resource, e)
        _abort(ctx.request)
        return response
    finally:
        if following is not None:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await following
    await response.write_eof(last)
    return response


async def serve_apibindings_list(ctx: ProxyRequest) -> web.StreamResponse:
    """A LIST of apibindings, which are no slice's (:attr:`ProxyRequest.membership`): one
    upstream request with the client's own query (its paging and selectors), every binding
    outside the request's scope left out and counted (:func:`_decode`). A workspace has few
    bindings; the page is read whole, as every upstream page is."""
    async with ctx.upstream.request(
        "GET",
        ctx.upstream_url,
        query=ctx.upstream_query(push_selector=False),
        headers=ctx.upstream_headers(),
    ) as up:
        if up.status != 200:
            return await relay_whole(up)
        headers = response_headers(up)
        page = _decode(ctx, await read_body(up))
    writer = _ListWriter(
        page,
        continue_token=page.continue_token,
        yaml=ctx.representation.yaml,
        strip_objects=ctx.strip_objects,
    )
    if ctx.representation.yaml:
        headers["Content-Type"] = YAML_CONTENT_TYPE
    return web.Response(status=200, body=writer.entries(page.entries, last=True), headers=headers)


def next_page_size(asked: int, page: Page, *, floor: int) -> int:
    """The limit of the next upstream page of a LIST the proxy pages itself, after ``page``
    (read with limit ``asked``): twice ``asked``, at most what fits :data:`PAGE_BYTES` at
    ``page``'s bytes per object and :data:`MAX_PAGE`, never below ``floor`` (``listPageSize``,
    the first page's).

    Why grow: every page is a LIST of its own for kcp, and many small pages multiply its cost
    (at 100,000 objects, paging at 500 cost kcp 4 times its unpaged LIST; at 10,000 objects,
    5,000 selected, two quick runs on a loaded 2-core machine gave 1.05 to 1.98 times at 500
    and 0.84 to 1.14 times at 1,000 to 5,000). Doubling keeps the first answer quick and the
    upstream's next page overlapping the proxy's work on this one, while the number of pages
    grows with the logarithm of the list (5,000 objects: 4 pages instead of 10; 50,000: 9
    instead of 100); the byte bound keeps memory at two pages of a few MiB whatever the object
    count."""
    received = len(page.entries) + page.out_of_scope
    grown = min(2 * asked, MAX_PAGE)
    if received:
        grown = min(grown, max(1, PAGE_BYTES * received // max(page.size, 1)))
    return max(grown, floor)


class _ListWriter:
    """Writes one list response from the first page's envelope and each page's visible entries:
    JSON with the entries' original bytes, or YAML (keys sorted, entries converted one by
    one), with Table rows' objects removed for ``includeObject=None``."""

    def __init__(
        self, first: Page, *, continue_token: str, yaml: bool, strip_objects: bool
    ) -> None:
        self._first = True
        self._yaml = yaml
        self._strip = strip_objects
        if not yaml:
            self._head = list_header(
                first, resource_version=first.resource_version, continue_token=continue_token
            )
            self._tail = LIST_FOOTER
            return
        fields = list_fields(
            first, resource_version=first.resource_version, continue_token=continue_token
        )
        key = "rows" if first.is_table else "items"
        self._head, self._tail = yamlout.list_parts(fields, entries_key=key)
        self._empty = yamlout.empty_list_parts(fields, entries_key=key)

    def entries(self, visible: Sequence[bytes | msgspec.Raw], *, last: bool = False) -> bytes:
        """The bytes of ``visible`` in the response (after the opening, for the first entries),
        and with ``last`` the list's end after them — copied once, in one join."""
        if not visible:
            return self.end() if last else b""
        parts: list[bytes | msgspec.Raw] = (
            [strip_row_object(r) for r in visible] if self._strip else list(visible)
        )
        if self._yaml:
            parts = [yamlout.entry(r) for r in parts]
            if self._first:
                parts.insert(0, self._head)
            if last:
                parts.append(self._tail)
            self._first = False
            return b"".join(parts)
        # Joined with "," in one pass: the opening (or the separator from the page before)
        # goes before the first entry, the end after the last.
        parts[0] = b"".join((self._head if self._first else b",", parts[0]))
        if last:
            parts[-1] = b"".join((parts[-1], self._tail))
        self._first = False
        return b",".join(parts)

    def end(self) -> bytes:
        if self._first:  # no entry at all
            return self._empty if self._yaml else self._head + self._tail
        return self._tail


@dataclass(frozen=True, slots=True)
class _Read:
    """One upstream page the proxy read for a client page, and the continue token it was read
    with ("": the list's first page, read at ``page.resource_version``)."""

    page: Page
    start: str


async def _fill(
    ctx: ProxyRequest,
    url: str,
    page: Page,
    query: list[tuple[str, str]],
    headers: CIMultiDict[str],
    *,
    limit: int,
    client: Selector,
) -> tuple[list[bytes | msgspec.Raw], str]:
    """Up to ``limit`` entries the slice sees, from ``page`` (read with the client's own limit,
    so that all of it fits) and the upstream pages after it — at most :data:`FILL_ROUNDS` pages
    once the client's page holds anything (else until it does, or the list ends) — and the
    continue token after the last of them (empty when nothing the slice sees follows).

    The token is always kcp's, from right after an entry the client gets: a continue token
    names the key of the entry it follows (``{"start": "<namespace>/<name>\\u0000"}``), so a
    token after an entry the slice does not see would tell the client that this object exists.
    So the client's page ends after its last entry, and an upstream page cut there is read
    again up to the cut for kcp's token after it (:func:`_token_after`)."""
    later = [
        (k, v)
        for k, v in query
        if k not in ("resourceVersion", "resourceVersionMatch", "limit", "continue")
    ]
    current = _Read(page, ctx.options.get("continue") or "")
    visible, end, rest = _take(page, ctx, client, want=limit)
    last = (current, end) if visible else None
    rounds = 1
    while len(visible) < limit and current.page.continue_token:
        if rounds >= FILL_ROUNDS and visible:
            break  # enough work for this page: the client asks for the next one
        start = current.page.continue_token
        size = max(limit - len(visible), ctx.page_size)
        asked = [*later, ("limit", str(size)), ("continue", start)]
        current = _Read(await _fetch(ctx, url, asked, headers), start)
        rounds += 1
        taken, end, rest = _take(current.page, ctx, client, want=limit - len(visible))
        if taken:
            visible += taken
            last = (current, end)
    if not rest and not current.page.continue_token:
        return visible, ""  # the list ended, and all the slice sees of it is on this page
    assert last is not None, "the loop ends early only once the client's page holds entries"
    read, count = last
    if count == len(read.page.entries):
        return visible, read.page.continue_token
    return visible, await _token_after(ctx, url, later, headers, read=read, count=count)


def _take(
    page: Page, ctx: ProxyRequest, client: Selector, *, want: int
) -> tuple[list[bytes | msgspec.Raw], int, bool]:
    """The first ``want`` entries of ``page`` the slice sees (all it sees, if fewer); how many
    of the page's entries precede the next one (up to and including the last one taken); and
    whether the page holds more that the slice sees."""
    shown = page.indexed_members(ctx.member, client)
    taken = shown[:want]
    if not taken:
        return [], 0, False
    return [entry for _, entry in taken], taken[-1][0] + 1, len(shown) > want


async def _token_after(
    ctx: ProxyRequest,
    url: str,
    later: list[tuple[str, str]],
    headers: CIMultiDict[str],
    *,
    read: _Read,
    count: int,
) -> str:
    """kcp's continue token right after the first ``count`` entries of ``read``: those entries
    read again (nothing of them is shown) — a continue token reads the snapshot it was issued
    at, and the list's first page is read again at its resourceVersion, exactly — and checked
    to be the same, else the token would skip or repeat entries, and the request fails."""
    if read.start:
        at = [("continue", read.start)]
    else:
        at = [
            ("resourceVersion", read.page.resource_version),
            ("resourceVersionMatch", "Exact"),
        ]
    again = await _fetch(ctx, url, [*later, ("limit", str(count)), *at], headers)
    if (
        len(again.entries) != count
        or not again.continue_token
        or _identity(again, count - 1) != _identity(read.page, count - 1)
    ):
        raise BadGateway("upstream answered a list page differently when it was read again")
    return again.continue_token


def _identity(page: Page, index: int) -> tuple[str, ...] | bytes:
    """What identifies entry ``index`` of ``page``: its object's uid, resourceVersion, namespace
    and name (the bytes of a Table row without an object)."""
    meta = page.metas[index]
    if meta is None:
        return bytes(page.entries[index])
    return (meta.uid, meta.resourceVersion, meta.namespace, meta.name)


async def _first_page(
    ctx: ProxyRequest, query: list[tuple[str, str]], headers: CIMultiDict[str]
) -> tuple[str, list[tuple[str, str]], Page, web.StreamResponse] | web.Response:
    """The first upstream page, with the URL and query it was read with (the later pages'),
    and the response to stream it in; or the upstream's error, relayed.

    A LIST of every namespace whose field selector names one namespace is asked as a LIST of
    that namespace (:func:`single_namespace`): kcp's first page of the former carries a
    continue token relative to the namespace, which kcp then reads as relative to the whole
    collection — the next page starts over (kcp v0.32.3, on the APIExport virtual workspace and
    on a workspace alike). The apiserver narrows such a list to the namespace itself
    (``genericregistry.Store.ListPredicate``), so the answers are the same; a resource that has
    no namespaced collection (404: cluster-scoped) is asked as the client asked."""
    targets = [(ctx.upstream_url, query)]
    narrowed = single_namespace(ctx.options.get("fieldSelector") or "")
    if narrowed is not None and not ctx.api.namespace and ctx.path.cluster != "*":
        namespace, rest = narrowed
        api = replace(ctx.api, namespace=namespace)
        fields = [("fieldSelector", rest)] if rest else []
        plain = [(k, v) for k, v in query if k != "fieldSelector"]
        targets.insert(0, (f"{ctx.cluster_base}{api.path}", [*plain, *fields]))
    for attempt, (url, asked) in enumerate(targets, start=1):
        async with ctx.upstream.request("GET", url, query=asked, headers=headers) as up:
            if up.status == 404 and attempt < len(targets):
                continue
            if up.status != 200:
                return await relay_whole(up)
            page = _decode(ctx, await read_body(up))
            return url, asked, page, web.StreamResponse(status=200, headers=response_headers(up))
    raise AssertionError("the last target's answer is returned")


_NAMESPACE_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def single_namespace(fields: str) -> tuple[str, str] | None:
    """The one namespace a field selector requires (``metadata.namespace=X`` or ``==X``, X a
    valid namespace name, once), and the selector's other terms; None if it requires none."""
    if "\\" in fields:
        return None  # escaped values: kcp reads them
    terms = [t.strip() for t in fields.split(",")] if fields else []
    found: list[tuple[int, str]] = []
    for index, term in enumerate(terms):
        key, equals, value = term.partition("==") if "==" in term else term.partition("=")
        if equals and not key.endswith("!") and key.strip() == "metadata.namespace":
            found.append((index, value.strip()))
    if len(found) != 1 or not _NAMESPACE_NAME.fullmatch(found[0][1]):
        return None
    index, namespace = found[0]
    return namespace, ",".join(t for i, t in enumerate(terms) if i != index)


async def _fetch(
    ctx: ProxyRequest, url: str, query: list[tuple[str, str]], headers: CIMultiDict[str]
) -> Page:
    async with ctx.upstream.request("GET", url, query=query, headers=headers) as up:
        if up.status != 200:
            # e.g. 410 when the snapshot expired mid-list: the client must relist.
            raise BadGateway(f"upstream answered {up.status} for a later list page")
        return _decode(ctx, await read_body(up))


def _decode(ctx: ProxyRequest, body: bytes) -> Page:
    """One upstream page, decoded as the shape the request negotiated, without the entries
    outside the request's scope (counted)."""
    try:
        page = decode_page(body, table=ctx.table, scope=ctx.scope)
    except UndecodableError as e:
        raise BadGateway(f"upstream sent an undecodable list: {e}") from e
    ctx.out_of_scope(page.out_of_scope)
    return page


def _abort(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.abort()
