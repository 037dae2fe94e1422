"""Watch events of claimed objects whose visibility changes by reference.

A Secret that a ``referencedBy`` rule shows (:mod:`vwserver.related`) becomes visible when a
visible object starts naming it and invisible when the last one stops (or leaves the slice) —
without any change of the Secret, so kcp's watch of secrets says nothing. A watch of a claimed
resource through the slice therefore also listens to the slice's reference index
(:class:`~vwserver.cache.related_index.SliceReferences`) and turns each transition in its scope
into one more event line *of the upstream's own shape*: the object as kcp serves it now, read
in the watch's representation (JSON, Table, PartialObjectMetadata), framed as
``{"type": ..., "object": ...}``. The line then goes through exactly the filter every upstream
event goes through (:func:`vwserver.proxy.watch.frame_events`), which decides what the client
gets — an ADDED for an object that became visible, the synthetic DELETED (identifying metadata
only) for one the watch delivered and that is no longer visible, nothing for one it never showed
— so the existence and representation rules are the same as for every other event.

The decisions (is a transition in the watch's scope, how a line is framed) are pure; the one
I/O is the GET of the object (gone meanwhile: nothing — its deletion is kcp's own event).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any, Final

import aiohttp
import msgspec

from vwserver.errors import BadGateway, UpstreamUnavailable
from vwserver.k8s import kcp
from vwserver.k8s.types import ObjectHead, ObjectMeta
from vwserver.proxy.context import ProxyRequest
from vwserver.proxy.filtering import Delivered, Scope
from vwserver.related import ClaimKey, Transition

log = logging.getLogger(__name__)

QUEUE: Final = 1024
"""Transitions one watch may have waiting; beyond, the watch ends (its client re-watches and
relists, as after any watch the server ends)."""


class Overflowed(Exception):
    """More transitions arrived than the watch could turn into events."""


def in_scope(transition: Transition, *, claim: ClaimKey, scope: Scope) -> bool:
    """Whether a transition concerns an object of this watch (its resource, logical cluster,
    namespace and name)."""
    cluster, namespace, name = transition.key
    return (
        transition.claim == claim
        and (scope.cluster in ("*", cluster))
        and (not scope.namespace or scope.namespace == namespace)
        and (not scope.name or scope.name == name)
    )


def event_line(kind: str, body: bytes) -> bytes:
    """One watch event line with the object bytes as kcp sent them."""
    return b'{"type":"' + kind.encode() + b'","object":' + body.strip() + b"}\n"


class _Row(msgspec.Struct):
    object: ObjectHead | None = None


class _Table(msgspec.Struct):
    rows: list[_Row] | None = None


def object_meta(body: bytes, *, table: bool) -> ObjectMeta | None:
    """The metadata of the object in a GET's answer — a Table's one row's object for a Table
    (the representation says which, never the bytes)."""
    try:
        if not table:
            return msgspec.json.decode(body, type=ObjectHead).metadata
        rows = msgspec.json.decode(body, type=_Table).rows or []
    except msgspec.DecodeError:
        return None
    return rows[0].object.metadata if len(rows) == 1 and rows[0].object is not None else None


async def fetch_line(
    ctx: ProxyRequest, transition: Transition, *, delivered: Delivered
) -> bytes | None:
    """The event line for ``transition``: the object now, in the watch's representation, as
    an ADDED (it became visible) or a MODIFIED (it is no longer visible: the filter makes that
    the synthetic DELETED). An object that stops being visible by reference was visible until
    this moment — the client holds it, from this watch or from the LIST it started after — so
    it is marked delivered first (it was in the slice: telling its client it left is no
    oracle). None when the object is gone or kcp cannot say now (a stale view is corrected by
    the client's next relist)."""
    cluster, namespace, name = transition.key
    api = replace(ctx.api, namespace=namespace, name=name, subresource="", legacy_watch=False)
    url = f"{kcp.clusters(ctx.upstream_base, cluster)}{api.object_path}"
    query = [("includeObject", "Metadata")] if ctx.strip_objects else []
    try:
        got = await ctx.upstream.fetch(url, query=query, headers=ctx.upstream_headers())
    except (BadGateway, UpstreamUnavailable) as e:
        log.info("watch on %s: a referenced object could not be read: %s", ctx.api.resource, e)
        return None
    if got.status != 200:
        return None
    if not transition.visible:
        meta = object_meta(got.body, table=ctx.table)
        if meta is None:
            return None
        if delivered.since or Delivered.key(meta) in delivered.keys:
            delivered.keys.add(Delivered.key(meta))
        else:
            return None  # the watch sent the initial state itself and never showed it
    return event_line("ADDED" if transition.visible else "MODIFIED", got.body)


class Listening:
    """The transitions of one pass-through watch, listened to from before its upstream request
    is sent (a transition while kcp is being asked would otherwise reach no listener) — and,
    for a watch from a resourceVersion, those the slice's index made since then
    (:meth:`~vwserver.cache.related_index.SliceReferences.since`: a LIST, a reference change,
    then the watch — the Secret it made visible has no change of its own to replay)."""

    def __init__(self, ctx: ProxyRequest, *, since: str) -> None:
        self.queue: asyncio.Queue[Transition] = asyncio.Queue()
        self.overflowed = False
        self.up: aiohttp.ClientResponse | None = None
        self._undo: Callable[[], None] | None = None
        references, claimed = ctx.references, ctx.claimed
        if references is None or claimed is None:
            return
        self._claim, self._scope = claimed.claim, ctx.scope
        if since.isdigit():
            missed = references.since(int(since))
            if missed is None:
                log.info(
                    "watch on %s from %s: the slice's reference history does not reach back",
                    ctx.api.resource,
                    since,
                )
            self._take(missed or [])
        self._undo = references.listen(self._take)

    @property
    def active(self) -> bool:
        return self._undo is not None

    def _take(self, transitions: list[Transition]) -> None:
        for t in transitions:
            if in_scope(t, claim=self._claim, scope=self._scope):
                if self.queue.qsize() >= QUEUE:
                    self.overflowed = True
                    if self.up is not None:
                        self.up.close()
                    return
                self.queue.put_nowait(t)

    def close(self) -> None:
        if self._undo is not None:
            self._undo()
            self._undo = None


async def merged(
    ctx: ProxyRequest,
    up: aiohttp.ClientResponse,
    *,
    delivered: Delivered,
    listening: Listening | None = None,
) -> AsyncIterator[tuple[bool, bytes]]:
    """The upstream's chunks (False, chunk) and, between them, one event line per transition
    of the slice's references in the watch's scope (True, line); ends with the upstream.
    ``listening``: started before the upstream request (else now, missing what came between)."""
    if listening is None:
        listening = Listening(ctx, since="")
    if not listening.active:
        async for chunk in up.content.iter_any():
            yield False, chunk
        return
    listening.up = up
    queue = listening.queue
    if listening.overflowed:
        up.close()
    read: asyncio.Future[bytes] | None = None
    got: asyncio.Future[Transition] | None = None
    try:
        while True:
            if read is None:
                read = asyncio.ensure_future(up.content.readany())
            if got is None:
                got = asyncio.ensure_future(queue.get())
            waiters: set[asyncio.Future[Any]] = {read, got}
            done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            if got in done:
                transition = got.result()
                got = None
                line = await fetch_line(ctx, transition, delivered=delivered)
                if line is not None:
                    yield True, line
            if read in done:
                chunk = read.result()
                read = None
                if not chunk:
                    break
                yield False, chunk
        if listening.overflowed:
            raise Overflowed("too many reference changes for this watch")
    finally:
        listening.close()
        for waiter in (read, got):
            if waiter is not None:
                waiter.cancel()
