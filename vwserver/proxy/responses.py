"""Relaying upstream responses to the client: headers, errors, plain streaming."""

from __future__ import annotations

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, MultiMapping

from vwserver.proxy.upstream import FORWARDED_RESPONSE_HEADERS
from vwserver.proxy.upstream import read_body as read_body  # re-exported for the body readers


def response_headers(upstream: aiohttp.ClientResponse) -> CIMultiDict[str]:
    return forwarded_response_headers(upstream.headers)


def forwarded_response_headers(received: MultiMapping[str]) -> CIMultiDict[str]:
    """The upstream response headers a client may see (:data:`FORWARDED_RESPONSE_HEADERS`)."""
    headers: CIMultiDict[str] = CIMultiDict()
    for name in FORWARDED_RESPONSE_HEADERS:
        for value in received.getall(name, ()):
            headers.add(name, value)
    return headers


async def relay_whole(upstream: aiohttp.ClientResponse) -> web.Response:
    """Relay a (small) upstream response as is: Status errors, single objects."""
    body = await read_body(upstream)
    return web.Response(status=upstream.status, body=body, headers=response_headers(upstream))


async def relay_stream(
    request: web.Request, upstream: aiohttp.ClientResponse
) -> web.StreamResponse:
    """Stream an upstream response through unchanged (discovery, apibindings); an error is
    relayed whole, so that the handler can still replace it (see its upstream denials)."""
    if upstream.status != 200:
        return await relay_whole(upstream)
    response = web.StreamResponse(status=upstream.status, headers=response_headers(upstream))
    await response.prepare(request)
    if not headers_only(request):
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
    await response.write_eof()
    return response


def headers_only(request: web.Request) -> bool:
    """A HEAD request gets the GET's status and headers and no body (RFC 9110 §9.3.2); a
    streamed response must stop after its headers itself."""
    return request.method == "HEAD"


async def prepare_list(request: web.Request, response: web.StreamResponse) -> bool:
    """Send a streamed list response's headers; False when no body follows (a HEAD request,
    whose response is then complete).

    The apiserver gzips large responses for clients that accept it; a streamed list's size is
    unknown up front, so the proxy compresses whenever the client accepts gzip.
    """
    if "gzip" in request.headers.get("Accept-Encoding", "") and not headers_only(request):
        response.enable_compression(web.ContentCoding.gzip)
    await response.prepare(request)
    if headers_only(request):
        await response.write_eof()
        return False
    return True
