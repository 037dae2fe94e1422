"""GET of one object, and the unfiltered pass-through reads (discovery, apibindings).

A GET of an object outside the slice answers exactly what a GET of a missing object answers —
the proxy replaces the upstream's own 404 with the same body it makes for an invisible object,
so status, headers and bytes cannot tell the two apart, in every representation (the object,
a Table, PartialObjectMetadata, YAML): the representation is negotiated before the upstream is
asked (:mod:`vwserver.proxy.negotiation`), so the upstream cannot refuse it only for objects
that exist.
"""

from __future__ import annotations

from aiohttp import web

from vwserver.errors import BadGateway
from vwserver.holds import as_leaving
from vwserver.proxy.context import ProxyRequest
from vwserver.proxy.filtering import (
    LIST_FOOTER,
    UndecodableError,
    decode_head,
    decode_page,
    decode_table_rows,
    list_header,
    strip_row_object,
)
from vwserver.proxy.responses import read_body, relay_stream, relay_whole, response_headers
from vwserver.proxy.yamlout import YAML_CONTENT_TYPE, json_to_yaml


async def serve_get(ctx: ProxyRequest) -> web.StreamResponse:
    async with ctx.upstream.request(
        "GET", ctx.upstream_url, query=ctx.upstream_query(), headers=ctx.upstream_headers()
    ) as up:
        if up.status == 404:
            return ctx.not_found()
        if up.status != 200:
            return await relay_whole(up)
        body = await read_body(up)
        headers = response_headers(up)
    try:
        visible = body_visible(body, ctx)
        if visible and ctx.strip_objects:
            body = _strip_table(body)
        elif visible:
            body = as_shown(body, ctx)
    except UndecodableError as e:
        raise BadGateway(f"upstream sent an undecodable object: {e}") from e
    if not visible:
        return ctx.not_found()
    if ctx.representation.yaml:
        headers["Content-Type"] = YAML_CONTENT_TYPE
        body = json_to_yaml(body)
    return web.Response(status=200, body=body, headers=headers)


def body_visible(body: bytes, ctx: ProxyRequest) -> bool:
    """Whether a GET response (an object, PartialObjectMetadata, or a Table of one row) may be
    shown: the slice sees the object (:meth:`ProxyRequest.sees`). A Table counts only if every
    row embeds an object the slice sees."""
    head = decode_head(body)
    if head.kind == "Table":
        rows = decode_table_rows(body)
        return bool(rows) and all(
            r.object is not None and ctx.sees(r.object.metadata) for r in rows
        )
    return ctx.sees(head.metadata)


def as_shown(body: bytes, ctx: ProxyRequest) -> bytes:
    """A visible object (or PartialObjectMetadata) as the slice shows it: being deleted when it
    is leaving the slice (:func:`vwserver.holds.as_leaving`)."""
    head = decode_head(body)
    if head.kind == "Table":
        return body
    since = ctx.leaving(head.metadata)
    return as_leaving(body, since) if since else body


def _strip_table(body: bytes) -> bytes:
    page = decode_page(body)
    return (
        list_header(page, resource_version=page.resource_version, continue_token="")
        + b",".join(strip_row_object(row) for row in page.entries)
        + LIST_FOOTER
    )


async def serve_passthrough(ctx: ProxyRequest) -> web.StreamResponse:
    """Discovery documents and read-only apibindings: streamed through unchanged."""
    async with ctx.upstream.request(
        "GET",
        ctx.upstream_url,
        query=ctx.options.items if ctx.api.discovery else ctx.upstream_query(push_selector=False),
        headers=ctx.upstream_headers(),
        read_timeout=None,
    ) as up:
        return await relay_stream(ctx.request, up)
