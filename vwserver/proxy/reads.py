"""GET of one object, and the unfiltered pass-through reads (discovery, apibindings).

A GET of an object outside the slice answers exactly what a GET of a missing object answers —
the proxy replaces the upstream's own 404 with the same body it makes for an invisible object,
so status, headers and bytes cannot tell the two apart (issue #2 §4; the Go peer answered 403
for one and 404 for the other).
"""

from __future__ import annotations

from aiohttp import web

from vwserver.errors import BadGateway
from vwserver.proxy.context import ProxyRequest
from vwserver.proxy.filtering import UndecodableError, decode_head, decode_page
from vwserver.proxy.responses import read_body, relay_stream, relay_whole, response_headers
from vwserver.proxy.upstream import forwarded_headers


async def serve_get(ctx: ProxyRequest) -> web.StreamResponse:
    async with ctx.upstream.request(
        "GET",
        ctx.upstream_url,
        query=ctx.upstream_query(),
        headers=forwarded_headers(ctx.request.headers),
    ) as up:
        if up.status == 404:
            return ctx.not_found()
        if up.status != 200:
            return await relay_whole(up)
        body = await read_body(up)
        headers = response_headers(up)
    if not body_visible(body, ctx):
        return ctx.not_found()
    return web.Response(status=200, body=body, headers=headers)


def body_visible(body: bytes, ctx: ProxyRequest) -> bool:
    """Whether a GET response (an object, or a Table of one row for kubectl) may be shown."""
    selector = ctx.route.selector
    try:
        head = decode_head(body)
        if head.kind == "Table":
            page = decode_page(body)
            return bool(page.entries) and len(page.visible(selector)) == len(page.entries)
        return selector.matches(head.metadata.labels)
    except UndecodableError as e:
        raise BadGateway(f"upstream sent an undecodable object: {e}") from e


async def serve_passthrough(ctx: ProxyRequest) -> web.StreamResponse:
    """Discovery documents and read-only apibindings: streamed through unchanged."""
    async with ctx.upstream.request(
        "GET",
        ctx.upstream_url,
        query=list(ctx.query.items()),
        headers=forwarded_headers(ctx.request.headers),
        read_timeout=None,
    ) as up:
        return await relay_stream(ctx.request, up)
