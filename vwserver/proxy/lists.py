"""Filtered LIST: paged upstream, streamed out, every item checked.

Memory is bounded by one upstream page, never by the size of the list:

* a client that pages itself (``limit``/``continue``, as kubectl and client-go's pager do) gets
  exactly one upstream request per request, with its own limit and token, and the combined
  selector pushed down — the upstream's continue token stays valid because every page of that
  list carries the same selector;
* a client that asks for everything is served by the proxy paging upstream with
  ``listPageSize`` and writing each page's matching items as soon as it has them. The response is
  one list; its resourceVersion is the first page's, which is the snapshot every page is read at.

Items are forwarded as the bytes the upstream sent. If the upstream fails after the first bytes
went out, the connection is aborted rather than closed cleanly, so the client sees a broken
response, never a short list that looks complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

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
    async with ctx.upstream.request("GET", ctx.upstream_url, query=query, headers=headers) as up:
        if up.status != 200:
            return await relay_whole(up)
        page = _decode(ctx, await read_body(up))
        response = web.StreamResponse(status=200, headers=response_headers(up))
    token = page.continue_token if client_pages else ""
    filled: list[bytes | msgspec.Raw] | None = None
    limit = int(ctx.options.get("limit") or 0)
    if holds and client_pages and limit:
        # kcp filled its page without the slice's selector: fill the client's page from as many
        # upstream pages as it takes, each asking for no more than is still missing (so no page
        # is cut in two), and hand out the last one's continue token — as the apiserver fills
        # a page with the objects its predicate takes.
        filled, token = await _fill(ctx, page, query, headers, limit=limit, client=client)
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
    # with a continue token.
    later = [(k, v) for k, v in query if k not in ("resourceVersion", "resourceVersionMatch")]
    following: asyncio.Task[Page] | None = None
    try:
        while True:
            if page.continue_token and not client_pages:
                # Fetch the next page while this one is filtered and written: the upstream's
                # work overlaps the proxy's, and at most two pages are held at once.
                following = asyncio.ensure_future(
                    _fetch(ctx, [*later, ("continue", page.continue_token)], headers)
                )
            visible: Sequence[bytes | msgspec.Raw]
            if filled is not None:
                visible = filled
            elif holds:
                visible = page.members(ctx.member, client)
            else:
                visible = page.visible(selector, ctx.member)
            chunk = writer.entries(visible)
            if chunk:
                await response.write(chunk)
            if following is None:
                break
            page, following = await following, None
        await response.write(writer.end())
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
    await response.write_eof()
    return response


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

    def entries(self, visible: Sequence[bytes | msgspec.Raw]) -> bytes:
        if not visible:
            return b""
        raws: list[bytes | msgspec.Raw] = (
            [strip_row_object(r) for r in visible] if self._strip else list(visible)
        )
        if self._yaml:
            body = b"".join(yamlout.entry(r) for r in raws)
        else:
            body = b",".join(raws)
            if not self._first:
                body = b"," + body
        if self._first:
            body = self._head + body
            self._first = False
        return body

    def end(self) -> bytes:
        if self._first:  # no entry at all
            return self._empty if self._yaml else self._head + self._tail
        return self._tail


async def _fill(
    ctx: ProxyRequest,
    page: Page,
    query: list[tuple[str, str]],
    headers: CIMultiDict[str],
    *,
    limit: int,
    client: Selector,
) -> tuple[list[bytes | msgspec.Raw], str]:
    """Up to ``limit`` entries the slice sees, from ``page`` and the upstream pages after it;
    and the continue token after the last page read."""
    visible: list[bytes | msgspec.Raw] = list(page.members(ctx.member, client))
    later = [
        (k, v)
        for k, v in query
        if k not in ("resourceVersion", "resourceVersionMatch", "limit", "continue")
    ]
    while len(visible) < limit and page.continue_token:
        missing = str(limit - len(visible))
        page = await _fetch(
            ctx, [*later, ("limit", missing), ("continue", page.continue_token)], headers
        )
        visible += page.members(ctx.member, client)
    return visible, page.continue_token


async def _fetch(
    ctx: ProxyRequest, query: list[tuple[str, str]], headers: CIMultiDict[str]
) -> Page:
    async with ctx.upstream.request("GET", ctx.upstream_url, query=query, headers=headers) as up:
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
