"""Filtered WATCH: one upstream watch per client watch, filtered event by event.

The upstream stream (newline-delimited JSON events) is framed here, not by aiohttp's readline, so
that one event may be as large as :data:`MAX_EVENT_BYTES` without the read buffer growing for
every connection. Each event is decoded once (:func:`~vwserver.proxy.filtering.filter_event`) and
a matching event is written as the exact bytes the upstream sent. All events decoded from one
upstream read are written with one ``write``, which also awaits the client's drain: a slow client
therefore slows down the upstream read (TCP backpressure) instead of growing a buffer.

The server runs with ``handler_cancellation=True``, so a client that disconnects cancels this
handler at its next ``await``, which closes the upstream connection immediately.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from aiohttp import web

from vwserver.errors import BadGateway
from vwserver.proxy.context import ProxyRequest
from vwserver.proxy.filtering import UndecodableError, filter_event
from vwserver.proxy.responses import relay_whole, response_headers
from vwserver.proxy.upstream import forwarded_headers
from vwserver.selector import Selector

log = logging.getLogger(__name__)

# etcd refuses values over 1.5 MiB by default and the apiserver requests over 3 MiB; an event adds
# a little envelope. Anything longer is not a Kubernetes watch event.
MAX_EVENT_BYTES = 4 * 2**20


async def serve_watch(ctx: ProxyRequest) -> web.StreamResponse:
    selector = ctx.effective_selector()
    async with ctx.upstream.request(
        "GET",
        ctx.upstream_url,
        query=ctx.upstream_query(),
        headers=forwarded_headers(ctx.request.headers),
        read_timeout=None,  # watches are long-lived; timeoutSeconds is the upstream's business
    ) as up:
        if up.status != 200:
            return await relay_whole(up)
        response = web.StreamResponse(status=200, headers=response_headers(up))
        await response.prepare(ctx.request)
        buffer = bytearray()
        # A slice that is deleted (or whose upstream moves) retires its route: closing the
        # upstream response ends this loop, and the client re-watches (issue #4).
        retired = asyncio.ensure_future(ctx.route.retired.wait())
        retired.add_done_callback(lambda _: up.close())
        try:
            async for chunk in up.content.iter_any():
                buffer += chunk
                out, consumed = frame_events(buffer, selector=selector)
                if consumed:
                    del buffer[:consumed]
                if len(buffer) > MAX_EVENT_BYTES:
                    raise BadGateway(f"upstream watch event larger than {MAX_EVENT_BYTES} bytes")
                if out:
                    await response.write(out)
        except (BadGateway, UndecodableError, aiohttp.ClientError, TimeoutError) as e:
            # The stream is broken (garbage, upstream gone): end it cleanly so that the client
            # re-watches from its last resourceVersion, as after any apiserver watch timeout.
            if ctx.route.retired.is_set():
                log.info("watch on %s ended: slice %s retired", ctx.api.resource, ctx.route.key)
            else:
                log.warning("watch on %s ended: %s: %s", ctx.api.resource, type(e).__name__, e)
        finally:
            retired.cancel()
    await response.write_eof()
    return response


def frame_events(buffer: bytearray, *, selector: Selector) -> tuple[bytes, int]:
    """Filter every complete event in ``buffer``; returns (bytes to send, bytes consumed).

    Lines are decoded straight from the buffer (a memoryview, no copy per event), and runs of
    consecutive forwarded events are sent as one slice of the original bytes.
    """
    out: list[bytes] = []
    start = run = 0  # run: where the current stretch of forwarded lines begins
    view = memoryview(buffer)
    try:
        while (end := buffer.find(b"\n", start)) != -1:
            if end - start > 1:  # not an empty keep-alive line
                verdict = filter_event(view[start : end + 1], selector)
                if not verdict.forward:
                    if run < start:
                        out.append(bytes(view[run:start]))
                    if verdict.replacement is not None:
                        out.append(verdict.replacement)
                    run = end + 1
            start = end + 1
        if run < start:
            out.append(bytes(view[run:start]))
    finally:
        view.release()
    return b"".join(out), start
