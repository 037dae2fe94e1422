"""Relaying upstream responses to the client: headers, errors, plain streaming."""

from __future__ import annotations

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from vwserver.errors import BadGateway
from vwserver.proxy.upstream import FORWARDED_RESPONSE_HEADERS

# Largest upstream body the proxy reads whole: one LIST page, one object (etcd's 1.5 MiB default,
# up to 3 MiB as the issue requires), or a Status. Pages are bounded by the page size.
MAX_BODY = 64 * 2**20


def response_headers(upstream: aiohttp.ClientResponse) -> CIMultiDict[str]:
    headers: CIMultiDict[str] = CIMultiDict()
    for name in FORWARDED_RESPONSE_HEADERS:
        for value in upstream.headers.getall(name, []):
            headers.add(name, value)
    return headers


async def read_body(upstream: aiohttp.ClientResponse, *, limit: int = MAX_BODY) -> bytes:
    """Read a whole upstream body, refusing absurd sizes instead of growing without bound."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in upstream.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise BadGateway(f"upstream response larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


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
