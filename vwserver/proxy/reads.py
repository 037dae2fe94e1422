"""GET of one object, and the reads that are no slice's: discovery, apibindings.

A GET of an object outside the slice answers exactly what a GET of a missing object answers —
the proxy replaces the upstream's own 404 with the same body it makes for an invisible object,
so status, headers and bytes cannot tell the two apart, in every representation (the object,
a Table, PartialObjectMetadata, YAML): the representation is negotiated before the upstream is
asked (:mod:`vwserver.proxy.negotiation`), so the upstream cannot refuse it only for objects
that exist.

APIBindings are the consumer workspace's own (read-only, cluster-scoped) objects, not the
slice's: the slice's membership does not apply to them (:attr:`ProxyRequest.membership`), but
the request's scope does — on a per-cluster URL every binding must carry that cluster's
``kcp.io/cluster``. A GET is checked by :func:`as_shown`, a WATCH event by event
(:func:`vwserver.proxy.watch.serve_watch`), a LIST page by page
(:func:`vwserver.proxy.lists.serve_apibindings_list`): each decoded by the structure the
request negotiated, at the cost of any other read.
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
from vwserver.proxy.responses import forwarded_response_headers, relay_stream
from vwserver.proxy.yamlout import YAML_CONTENT_TYPE, json_to_yaml


async def serve_get(ctx: ProxyRequest) -> web.StreamResponse:
    got = await ctx.upstream.fetch(
        ctx.upstream_url, query=ctx.upstream_query(), headers=ctx.upstream_headers()
    )
    if got.status == 404:
        return ctx.not_found()
    headers = forwarded_response_headers(got.headers)
    if got.status != 200:
        return web.Response(status=got.status, body=got.body, headers=headers)
    try:
        shown = as_shown(got.body, ctx)
    except UndecodableError as e:
        raise BadGateway(f"upstream sent an undecodable object: {e}") from e
    if shown is None:
        return ctx.not_found()
    if ctx.representation.yaml:
        headers["Content-Type"] = YAML_CONTENT_TYPE
        shown = json_to_yaml(shown)
    return web.Response(status=200, body=shown, headers=headers)


def as_shown(body: bytes, ctx: ProxyRequest) -> bytes | None:
    """A GET response as the slice shows it, None when the slice does not see it
    (:func:`vwserver.holds.sees`) or it is not the object the URL names. It is decoded as the
    shape the request negotiated — never guessed from its ``kind`` (a custom resource may be
    called ``Table``, or have ``rows``): the object or PartialObjectMetadata by its own
    metadata; a Table of one row by the objects its rows embed — it counts only if every row
    embeds an object the slice sees, and loses the objects when the client asked for none. An
    object the slice is letting go of shows as being deleted (:func:`vwserver.holds.as_leaving`).

    An object outside the request's scope (another logical cluster, namespace or name than
    the URL's: an upstream bug) is answered like a missing one — 404, not 502: the client may
    learn nothing from it, not even that the upstream had something there — and counted.
    An apibinding is checked against the scope only (:attr:`ProxyRequest.membership`)."""
    scope, membership = ctx.scope, ctx.membership
    if ctx.table:
        rows = decode_table_rows(body)
        if not rows or any(meta is None for meta in rows):
            return None
        if not all(meta is not None and scope.admits(meta) for meta in rows):
            ctx.out_of_scope()
            return None
        if membership and not all(meta is not None and ctx.sees(meta) for meta in rows):
            return None
        return _strip_table(body) if ctx.strip_objects else body
    head = decode_head(body)
    if not scope.admits(head.metadata):
        ctx.out_of_scope()
        return None
    if not membership:
        return body
    if not ctx.sees(head.metadata):
        return None
    since = ctx.leaving(head.metadata)
    return body if since is None else as_leaving(body, since)


def _strip_table(body: bytes) -> bytes:
    page = decode_page(body, table=True)
    return (
        list_header(page, resource_version=page.resource_version, continue_token="")
        + b",".join(strip_row_object(row) for row in page.entries)
        + LIST_FOOTER
    )


async def serve_passthrough(ctx: ProxyRequest) -> web.StreamResponse:
    """Discovery documents (they hold no objects): streamed through unchanged."""
    async with ctx.upstream.request(
        "GET",
        ctx.upstream_url,
        query=ctx.options.items,
        headers=ctx.upstream_headers(),
        read_timeout=None,
    ) as up:
        return await relay_stream(ctx.request, up)
