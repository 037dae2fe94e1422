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

Each watch keeps what it has shown its client (:class:`~vwserver.proxy.filtering.Delivered`):
a synthetic DELETED names only an object this watch delivered, never one the slice cannot see
(the rule and its reasons: :mod:`vwserver.proxy.filtering`). Events outside the request's own
scope (another logical cluster, namespace or name) are dropped, counted and logged.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import NamedTuple

import aiohttp
import msgspec
from aiohttp import web

from vwserver import metrics as m
from vwserver.cache.views import escape_field_value
from vwserver.errors import BadGateway, UpstreamUnavailable
from vwserver.holds import Member
from vwserver.k8s import kcp
from vwserver.k8s.framing import complete, lines
from vwserver.k8s.kcp import CLUSTER_ANNOTATION
from vwserver.k8s.types import ObjectHead
from vwserver.proxy import reference_events
from vwserver.proxy.context import ProxyRequest
from vwserver.proxy.filtering import (
    ANYWHERE,
    Delivered,
    EventVerdict,
    Scope,
    UndecodableError,
    decode_page,
    filter_event,
    settle,
    shows,
)
from vwserver.proxy.negotiation import JSON
from vwserver.proxy.responses import headers_only, relay_whole, response_headers
from vwserver.proxy.upstream import forwarded_headers
from vwserver.selector import Selector

log = logging.getLogger(__name__)


async def serve_watch(ctx: ProxyRequest) -> web.StreamResponse:
    # Apibindings are no slice's (ProxyRequest.membership): the client's own query goes to
    # kcp, and every event is checked against the request's scope only.
    membership = ctx.membership
    selector = ctx.effective_selector() if membership else Selector()
    member = ctx.member if membership else None
    strip = ctx.strip_objects
    table, scope, delivered = ctx.table, ctx.scope, Delivered(since=_start(ctx))
    # Listening to the slice's references starts before kcp is asked (claimed resources).
    listening = reference_events.Listening(ctx, since=delivered.since)
    try:
        return await _watch(
            ctx,
            listening,
            selector=selector,
            member=member,
            strip=strip,
            table=table,
            scope=scope,
            delivered=delivered,
            membership=membership,
        )
    finally:
        listening.close()


async def _watch(
    ctx: ProxyRequest,
    listening: reference_events.Listening,
    *,
    selector: Selector,
    member: Member | None,
    strip: bool,
    table: bool,
    scope: Scope,
    delivered: Delivered,
    membership: bool,
) -> web.StreamResponse:
    async with ctx.upstream.request(
        "GET",
        ctx.upstream_url,
        query=ctx.upstream_query(push_selector=membership),
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
        columns = Columns()
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
                async for synthetic, chunk in reference_events.merged(
                    ctx, up, delivered=delivered, listening=listening
                ):
                    if synthetic:
                        # A whole event line about a claimed object whose visibility by
                        # reference changed: before the rest of a line still arriving.
                        buffer[0:0] = chunk
                    else:
                        buffer += chunk
                    while True:
                        # EventTooLarge (a BadGateway) if an event grows past the bound
                        framed = frame_events(
                            buffer,
                            selector=selector,
                            table=table,
                            strip_objects=strip,
                            member=member,
                            scope=scope,
                            delivered=delivered,
                            columns=columns,
                        )
                        if framed.consumed:
                            del buffer[: framed.consumed]
                            if framed.forwarded:
                                forwarded.inc(framed.forwarded)
                            if framed.dropped:
                                dropped.inc(framed.dropped)
                            if framed.synthesized:
                                synthesized.inc(framed.synthesized)
                            if framed.out_of_scope:
                                ctx.out_of_scope(framed.out_of_scope)
                        if framed.out:
                            await response.write(framed.out)
                        if framed.asking is None:
                            break
                        # The next line is about an object this watch never showed that the
                        # client may hold from before it: ask kcp (rare; once per object).
                        before = await _visible_before(
                            ctx, framed.asking.ask, since=delivered.since, selector=selector
                        )
                        verdict = settle(framed.asking, visible_before=before, delivered=delivered)
                        del buffer[: framed.asking_length]
                        if verdict.replacement is not None:
                            synthesized.inc()
                            await response.write(verdict.replacement)
                        else:
                            dropped.inc()
        except (
            BadGateway,
            UndecodableError,
            aiohttp.ClientError,
            TimeoutError,
            reference_events.Overflowed,
        ) as e:
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
    out_of_scope: int = 0
    """Of the dropped events, those whose object was outside the request's scope."""
    asking: EventVerdict | None = None
    """The event after the consumed bytes cannot be decided yet (its ``ask``): what it
    needs (:func:`~vwserver.proxy.filtering.settle`); framing stopped before it."""
    asking_length: int = 0
    """The length of that event's line (its bytes follow the consumed ones)."""


@dataclass(slots=True)
class Columns:
    """A Table watch's column definitions: kcp sends them with the first event only. When the
    proxy drops that event (an object the slice does not show — the upstream cannot filter a
    claimed resource by name), the first event it does send carries them instead, so that the
    client's first event looks the same whatever it was not shown."""

    sent: bool = False
    pending: bytes | None = None


class _TableObject(msgspec.Struct):
    # (msgspec.Raw cannot be in a union: "absent" is a raw null)
    columnDefinitions: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))


class _TableEvent(msgspec.Struct):
    object: _TableObject | None = None


def _columns_of(line: bytes | memoryview) -> bytes | None:
    try:
        obj = msgspec.json.decode(line, type=_TableEvent).object
    except msgspec.DecodeError:
        return None
    if obj is None:
        return None
    raw = bytes(obj.columnDefinitions)
    return raw if raw not in (b"null", b"[]") else None


def _with_columns(line: bytes, columns: bytes) -> bytes:
    event = msgspec.json.decode(line)
    if isinstance(event, dict) and isinstance(event.get("object"), dict):
        event["object"]["columnDefinitions"] = msgspec.Raw(columns)
        return msgspec.json.encode(event) + b"\n"
    return line


def frame_events(
    buffer: bytearray,
    *,
    selector: Selector,
    table: bool = False,
    strip_objects: bool = False,
    member: Member | None = None,
    scope: Scope = ANYWHERE,
    delivered: Delivered | None = None,
    columns: Columns | None = None,
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
    events = dropped = synthesized = foreign = 0
    if delivered is None:
        delivered = Delivered()
    view = memoryview(buffer)
    try:
        for start, stop in lines(buffer, end):
            events += 1
            verdict = filter_event(
                view[start:stop],
                selector,
                table=table,
                strip_objects=strip_objects,
                member=member,
                scope=scope,
                delivered=delivered,
            )
            if verdict.ask:
                events -= 1  # counted when it is settled
                if run < start:
                    out.append(bytes(view[run:start]))
                forwarded = events - dropped - synthesized
                data = b"".join(out)
                return Framed(
                    data, start, forwarded, dropped, synthesized, foreign, verdict, stop - start
                )
            carry = table and columns is not None and not columns.sent
            if carry:
                assert columns is not None
                own = _columns_of(view[start:stop])
                if verdict.forward and own is not None:
                    columns.sent = True
                elif verdict.forward and columns.pending is not None:
                    # the first event sent: it carries the columns of the one dropped
                    if run < start:
                        out.append(bytes(view[run:start]))
                    out.append(_with_columns(bytes(view[start:stop]), columns.pending))
                    columns.sent = True
                    run = stop
                    continue
                elif own is not None:
                    columns.pending = own
            if not verdict.forward:
                if run < start:
                    out.append(bytes(view[run:start]))
                if verdict.replacement is not None:
                    replacement = verdict.replacement
                    if carry and columns is not None and columns.pending is not None:
                        replacement = _with_columns(replacement, columns.pending)
                        columns.sent = True
                    out.append(replacement)
                    synthesized += 1
                else:
                    dropped += 1
                    foreign += verdict.out_of_scope
                run = stop
        if run < end:
            out.append(bytes(view[run:end]))
    finally:
        view.release()
    forwarded = events - dropped - synthesized
    return Framed(b"".join(out), end, forwarded, dropped, synthesized, foreign)


def _start(ctx: ProxyRequest) -> str:
    """The resourceVersion a watch starts after when the client's state at its start came from
    elsewhere (a LIST, an earlier watch); ``""`` when the upstream sends the initial state as
    ADDED events itself (no resourceVersion or ``0``: the state of the watch cache;
    ``sendInitialEvents=true``)."""
    rv = ctx.options.get("resourceVersion") or ""
    if rv in ("", "0") or ctx.options.flag("sendInitialEvents"):
        return ""
    return rv


async def _visible_before(
    ctx: ProxyRequest, heads: tuple[ObjectHead, ...], *, since: str, selector: Selector
) -> set[str]:
    """The keys (:meth:`Delivered.key`) of those objects the slice showed at resourceVersion
    ``since`` — what a LIST through the slice at ``since`` would have held: kcp is asked for
    exactly that (one exact-resourceVersion LIST per object, narrowed to its name). Nothing is
    shown when kcp cannot say (e.g. ``since`` was compacted): a client is never told about an
    object it may not have seen."""
    shown: set[str] = set()
    headers = forwarded_headers(ctx.request.headers, accept=JSON)
    for head in heads:
        meta = head.metadata
        cluster = (meta.annotations or {}).get(CLUSTER_ANNOTATION, "")
        if not cluster:
            continue
        api = replace(ctx.api, namespace=meta.namespace, name="", subresource="")
        url = f"{kcp.clusters(ctx.upstream_base, cluster)}{api.collection_path}"
        query = [
            ("resourceVersion", since),
            ("resourceVersionMatch", "Exact"),
            ("fieldSelector", f"metadata.name={escape_field_value(meta.name)}"),
        ]
        rendered = selector.render()
        if rendered:
            query.append(("labelSelector", rendered))
        try:
            got = await ctx.upstream.fetch(url, query=query, headers=headers)
        except (BadGateway, UpstreamUnavailable) as e:
            log.info("watch on %s: state at %s unknown: %s", ctx.api.resource, since, e)
            continue
        if got.status != 200:
            log.info("watch on %s: state at %s unknown (%d)", ctx.api.resource, since, got.status)
            continue
        try:
            page = decode_page(got.body, scope=ctx.scope)
        except UndecodableError as e:
            log.info("watch on %s: state at %s undecodable: %s", ctx.api.resource, since, e)
            continue
        key = Delivered.key(meta)
        if any(
            item is not None and Delivered.key(item) == key and shows(selector, ctx.member, item)
            for item in page.metas
        ):
            shown.add(key)
    return shown
