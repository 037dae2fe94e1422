"""Filtered WATCH: one upstream watch per client watch, filtered event by event.

The upstream stream (newline-delimited JSON events) is framed with :mod:`vwserver.k8s.framing`,
not by aiohttp's readline, so that one event may be as large as
:data:`~vwserver.k8s.framing.MAX_EVENT_BYTES` without the read buffer growing for every
connection. Each event is decoded once (:func:`~vwserver.proxy.filtering.filter_event`) and
a matching event is written as the exact bytes the upstream sent. All events decoded from one
upstream read are written with one ``write``, which also awaits the client's drain: a slow client
therefore slows down the upstream read (TCP backpressure) instead of growing a buffer.

The server runs with ``handler_cancellation=True``, so a client that disconnects cancels this
handler at its next ``await``, which closes the upstream connection immediately.

A watch also ends — cleanly, with the chunked stream's last chunk, as after an apiserver watch
timeout, so that client-go re-watches from its last resourceVersion — when its slice is retired
or the server shuts down (the re-watch then reaches another replica).

Metrics are counted per upstream read, not per event: :func:`frame_events` tallies its verdicts
in local integers, and the counters are bumped once per chunk.
"""

from __future__ import annotations

import asyncio
import logging
from typing import NamedTuple

import aiohttp
from aiohttp import web

from vwserver import metrics as m
from vwserver.errors import BadGateway
from vwserver.holds import Member
from vwserver.k8s.framing import complete, lines
from vwserver.proxy.context import ProxyRequest
from vwserver.proxy.filtering import UndecodableError, filter_event
from vwserver.proxy.responses import headers_only, relay_whole, response_headers
from vwserver.selector import Selector

log = logging.getLogger(__name__)


async def serve_watch(ctx: ProxyRequest) -> web.StreamResponse:
    selector = ctx.effective_selector()
    strip = ctx.strip_objects
    async with ctx.upstream.request(
        "GET",
        ctx.upstream_url,
        query=ctx.upstream_query(),
        headers=ctx.upstream_headers(),
        read_timeout=None,  # watches are long-lived; timeoutSeconds is the upstream's business
    ) as up:
        if up.status != 200:
            return await relay_whole(up)
        response = web.StreamResponse(status=200, headers=response_headers(up))
        await response.prepare(ctx.request)
        if headers_only(ctx.request):
            await response.write_eof()
            return response
        buffer = bytearray()
        # A slice that is deleted (or whose upstream moves) retires its route, and a
        # server that shuts down closes every watch: closing the upstream response
        # ends this loop, and the client re-watches.
        ending = [asyncio.ensure_future(event.wait()) for event in (ctx.route.retired, ctx.closing)]
        for waiter in ending:
            waiter.add_done_callback(lambda _: up.close())
        slice_label = ctx.record.slice
        events = ctx.metrics.watch_events
        forwarded, dropped, synthesized = (
            events.labels(slice_label, outcome)
            for outcome in (m.FORWARDED, m.DROPPED, m.SYNTHESIZED)
        )
        try:
            with ctx.metrics.open_watches.labels(slice_label).track_inprogress():
                async for chunk in up.content.iter_any():
                    buffer += chunk
                    # EventTooLarge (a BadGateway) if an event grows past the bound
                    framed = frame_events(
                        buffer, selector=selector, strip_objects=strip, member=ctx.member
                    )
                    if framed.consumed:
                        del buffer[: framed.consumed]
                        if framed.forwarded:
                            forwarded.inc(framed.forwarded)
                        if framed.dropped:
                            dropped.inc(framed.dropped)
                        if framed.synthesized:
                            synthesized.inc(framed.synthesized)
                    if framed.out:
                        await response.write(framed.out)
        except (BadGateway, UndecodableError, aiohttp.ClientError, TimeoutError) as e:
            # The stream is broken (garbage, upstream gone): end it cleanly so that the client
            # re-watches from its last resourceVersion, as after any apiserver watch timeout.
            if ctx.route.retired.is_set():
                log.info("watch on %s ended: slice %s retired", ctx.api.resource, ctx.route.key)
            elif ctx.closing.is_set():
                log.info("watch on %s ended: server shutting down", ctx.api.resource)
            else:
                broken = isinstance(e, BadGateway | UndecodableError)
                kind = m.BAD_GATEWAY if broken else m.UNREACHABLE
                ctx.metrics.upstream_errors.labels(kind).inc()
                log.warning("watch on %s ended: %s: %s", ctx.api.resource, type(e).__name__, e)
        finally:
            for waiter in ending:
                waiter.cancel()
    await response.write_eof()
    return response


class Framed(NamedTuple):
    """What :func:`frame_events` made of a buffer."""

    out: bytes
    """The bytes to send."""
    consumed: int
    """How many bytes of the buffer were complete lines (now dealt with)."""
    forwarded: int
    """Events sent as the original bytes."""
    dropped: int
    """Events filtered out with nothing sent."""
    synthesized: int
    """Events replaced by a synthetic DELETED."""


def frame_events(
    buffer: bytearray,
    *,
    selector: Selector,
    strip_objects: bool = False,
    member: Member | None = None,
) -> Framed:
    """Filter every complete event in ``buffer``: what to send, what was consumed, and how many
    events were forwarded, dropped and synthesized. Raises
    :class:`~vwserver.errors.EventTooLarge` when the unfinished rest exceeds the bound.

    Lines are decoded straight from the buffer (a memoryview, no copy per event), and runs of
    consecutive forwarded events are sent as one slice of the original bytes.
    """
    end = complete(buffer)
    out: list[bytes] = []
    run = 0  # where the current stretch of forwarded lines begins
    events = dropped = synthesized = 0
    view = memoryview(buffer)
    try:
        for start, stop in lines(buffer, end):
            events += 1
            verdict = filter_event(
                view[start:stop], selector, strip_objects=strip_objects, member=member
            )
            if not verdict.forward:
                if run < start:
                    out.append(bytes(view[run:start]))
                if verdict.replacement is not None:
                    out.append(verdict.replacement)
                    synthesized += 1
                else:
                    dropped += 1
                run = stop
        if run < end:
            out.append(bytes(view[run:end]))
    finally:
        view.release()
    forwarded = events - dropped - synthesized
    return Framed(b"".join(out), end, forwarded, dropped, synthesized)
