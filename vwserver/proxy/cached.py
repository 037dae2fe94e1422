"""LIST and WATCH served from the shared watch cache (:mod:`vwserver.cache`).

The request was parsed and admitted like any other; :func:`~vwserver.proxy.cache_plan.
cacheable` decided that the cache can answer it exactly. What the client sees is computed here
from the cache's state and event window: the slice's membership (:func:`vwserver.cache.views.
visible`) and the client's own selectors, applied in process, in the representation the client
negotiated (plain objects or PartialObjectMetadata; Tables in
:mod:`vwserver.proxy.cached_tables`, from the same pages and transitions). Objects leave as the
bytes kcp sent.

Whenever the cache cannot answer with the apiserver's semantics *before the response started*
— not synced yet, cannot catch up with a consistent read in time — :class:`Fallback` sends the
request down the pass-through path instead, which asks kcp. After the headers went out, a watch
that cannot continue (the client fell behind, the cache relisted, the slice was retired, the
server shuts down) ends cleanly like an apiserver watch timeout: client-go re-watches from its
last resourceVersion.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Final

import msgspec
from aiohttp import web

from vwserver.cache.entries import Change, Entry
from vwserver.cache.shared import Bookmark, SharedResource, Subscription
from vwserver.cache.store import Expired as WindowExpired
from vwserver.cache.views import (
    ClientFilter,
    SliceView,
    accepts,
    leaving,
    parse_field_selector,
    transition,
)
from vwserver.errors import BadRequest, Expired, SelectorError
from vwserver.holds import as_leaving
from vwserver.k8s import kcp
from vwserver.k8s.kcp import ORIGINAL_API_VERSION_ANNOTATION, shard_id
from vwserver.k8s.status import status_body
from vwserver.proxy.cache_plan import Consistency, Continue, ListPlan, WatchPlan, encode_continue
from vwserver.proxy.context import ProxyRequest
from vwserver.proxy.filtering import LIST_FOOTER, list_opening
from vwserver.proxy.negotiation import Shape
from vwserver.proxy.responses import headers_only, prepare_list
from vwserver.selector import Selector

log = logging.getLogger(__name__)

# How long a request waits for the cache before the pass-through path answers it instead: the
# first sync of a shared resource, or a read that must be at least as new as a resourceVersion
# the cache has not reached.
#
# A consistent read (no resourceVersion) must not miss a write that completed before it
# started. What can prove that of the cache — verified on kcp v0.32.3's APIExport VW
# (tests/e2e/test_consistent_list_kcp.py; figures from the loaded 2-core test machine):
#
# * kcp's current resourceVersion X is at least that of every write completed before it is
#   asked for, to any resource: a one-item LIST (``limit=1``, 4-7 ms at 10k objects when kcp's
#   cache is current; the cheapest) or a watch-list (``sendInitialEvents=true``,
#   ``resourceVersionMatch=NotOlderThan``) whose selector matches nothing, which sends only the
#   ``k8s.io/initial-events-end`` BOOKMARK at X (7-13 ms, and it costs a connection: the
#   stream must be cut); a LIST whose selector matches nothing, 10-17 ms (kcp filters every
#   object). Right after a write to another resource every one of them may wait ~90 ms for
#   kcp's own cache to catch up (a direct consistent LIST waits as long).
# * X counts every write of the shard (etcd's revision): other resources and workspaces move
#   it without an event on this resource's stream, which then reaches X only with its next
#   event or a bookmark: kcp's periodic one (about once a minute; an idle kcp writes something
#   of its own about every 10 s), or the one kcp sends 2 s before a watch's deadline — with
#   ``timeoutSeconds=3`` 0.9-1.6 s after the watch started, at the resourceVersion of the last
#   consistent read of the resource (this one-item LIST included), and none with 1 or 2.
# * Two watches are not ordered with each other: a watch-list's bookmark at X arrived BEFORE
#   another watch of the same resource had delivered its events <= X in 2-35% of probes under
#   concurrent writes (35% at 1.5k objects, 2% at 10k, where the probe itself takes longer;
#   the events followed 0.5-12 ms later). "kcp is at X" says nothing about where the
#   reflector's stream is. (scripts/kcp/freshness_signals.py measures this and the costs.)
# * A watch from an older resourceVersion replays this resource's events since then at once,
#   but nothing marks the end of the replay (no bookmark follows it); a watch-list with a
#   resourceVersion sends the matching *state*, not the changes, before its bookmark. Proofs
#   on a stream of their own therefore cost the whole matching state: a full list.
#
# So the proof that costs no upstream list is on the reflector's own stream (one stream is
# ordered): an event or bookmark at X or beyond means it delivered every change of this
# resource up to X. The wait covers this resource's events in flight after X was read (a
# client's own write just before its read); when it ends unproven, kcp answers (correct, just
# not faster). A write to this resource after every other write of the shard — kubectl apply
# then get, a busy resource — proves it within milliseconds. A read that found kcp ahead asks
# the reflector for progress (SharedResource.upstream_at, vwserver/k8s/progress.py): its
# watches are 3 s long for a minute, so the pre-deadline bookmark brings the stream to X
# within ~2 s, and the reads after it are proven unless the shard wrote something since.
SYNC_WAIT: Final = 10.0
FRESHNESS_WAIT: Final = 0.02
QUEUE_SIZE: Final = 1024
"""Changes a watch may fall behind before it is ended (the client re-watches)."""
_WRITE_BATCH: Final = 256

_META_GROUP_VERSION: Final = "meta.k8s.io/v1"
_encode = msgspec.json.Encoder().encode


class Fallback(Exception):
    """The cache cannot answer this request exactly right now: use the pass-through path.

    ``objects`` and ``raw_bytes``: the cache's collection (all logical clusters) when the cache
    is synced — how large kcp's answer can be, for the pass-through's first upstream page
    (:func:`~vwserver.proxy.lists.first_page_size`)."""

    def __init__(self, message: str, *, objects: int = 0, raw_bytes: int = 0) -> None:
        super().__init__(message)
        self.objects = objects
        self.raw_bytes = raw_bytes


class _MetadataOnly(msgspec.Struct):
    metadata: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"{}"))


_decode_metadata = msgspec.json.Decoder(_MetadataOnly).decode


# --------------------------------------------------------------------------------------------
# Views


def client_filter(ctx: ProxyRequest) -> ClientFilter:
    """The client's own selectors: its path's logical cluster and namespace, ``labelSelector``
    and ``fieldSelector`` (400 as the apiserver words it when malformed)."""
    text = ctx.options.get("labelSelector") or ""
    try:
        labels = Selector.parse(text) if text else Selector.parse("")
    except SelectorError as e:
        raise BadRequest(e.message) from e
    try:
        fields = parse_field_selector(ctx.options.get("fieldSelector") or "")
    except ValueError as e:
        raise BadRequest(str(e)) from e
    return ClientFilter(
        cluster=ctx.path.cluster,
        namespace=ctx.api.namespace or None,
        labels=labels,
        fields=fields,
    )


class _Encoder:
    """Encodes entries in the negotiated shape: the stored bytes, or a PartialObjectMetadata
    holding the object's metadata bytes."""

    def __init__(
        self, *, shape: Shape, kind: str, api_version: str, original_api_version: bool = True
    ) -> None:
        self.partial = shape is not Shape.OBJECT
        self.original_api_version = original_api_version
        self.item_kind = "PartialObjectMetadata" if self.partial else kind
        self.item_api_version = _META_GROUP_VERSION if self.partial else api_version
        self.api_version = api_version

    def item(self, raw: bytes) -> bytes:
        if not self.partial:
            return raw
        # kcp names the object's own apiVersion in an annotation of its PartialObjectMetadata
        # (of the export's resources; not of core ones, e.g. a claimed Secret: kcp v0.32.3,
        # tests/e2e/test_related_slice_kcp.py): the metadata is decoded (only it) to add that
        # one member.
        metadata = msgspec.json.decode(_decode_metadata(raw).metadata)
        if self.original_api_version:
            annotations = metadata.get("annotations")
            if not isinstance(annotations, dict):
                annotations = metadata["annotations"] = {}
            annotations[ORIGINAL_API_VERSION_ANNOTATION] = self.api_version
        return (
            b'{"kind":"PartialObjectMetadata","apiVersion":"'
            + _META_GROUP_VERSION.encode()
            + b'","metadata":'
            + _encode(metadata)
            + b"}"
        )

    def event(self, kind: str, raw: bytes) -> bytes:
        return b'{"type":"' + kind.encode() + b'","object":' + self.item(raw) + b"}\n"

    def bookmark(self, rv: int, *, initial_events_end: bool = False) -> bytes:
        metadata: dict[str, object] = {"resourceVersion": str(rv)}
        if initial_events_end:
            # client-go's watch-list waits for this annotation on a BOOKMARK to know that the
            # initial state is complete (k8s.io/apimachinery metav1.InitialEventsAnnotationKey).
            metadata["annotations"] = {"k8s.io/initial-events-end": "true"}
        obj = {"kind": self.item_kind, "apiVersion": self.item_api_version, "metadata": metadata}
        return _encode({"type": "BOOKMARK", "object": obj}) + b"\n"


def _encoder(ctx: ProxyRequest, resource: SharedResource) -> _Encoder:
    return _Encoder(
        shape=ctx.representation.shape,
        kind=resource.kind,
        api_version=resource.api_version,
        # a claimed core resource (Secrets, ConfigMaps): kcp's PartialObjectMetadata of it
        # carries no original-api-version annotation
        original_api_version=not (ctx.claimed is not None and not ctx.api.group),
    )


# --------------------------------------------------------------------------------------------
# Waiting for the cache (before any byte goes out)


async def ready(
    ctx: ProxyRequest,
    resource: SharedResource,
    consistency: Consistency,
    rv: int,
    *,
    watch: bool = False,
) -> None:
    """Wait until the cache may answer with ``consistency``; :class:`Fallback` otherwise.

    A ``watch`` whose state must be at least as new as ``rv`` (watch-list) is served from the
    cache's state even when the cache has not reached ``rv`` after the wait: kcp's answer to a
    watch can only filter by labels, so it would show an object leaving the slice as deleted
    (breaking the handoff), while the cache's watch sends any change it has not applied yet as
    the next event — the client's informer ends at the same state either way."""
    if not await resource.wait_synced(SYNC_WAIT):
        raise Fallback(f"cache of {ctx.api.resource} not synced: {resource.last_error}")
    await _cluster_served_here(ctx, resource)
    if consistency is not Consistency.CONSISTENT and rv > resource.store.rv:
        await refuse_foreign_resource_version(ctx, rv)
    loop = asyncio.get_running_loop()
    if consistency is Consistency.CONSISTENT:
        if resource.behind_upstream and not watch:
            # An earlier consistent read found kcp ahead of the stream, and nothing has
            # arrived on the stream since: kcp's resourceVersion now is that one or newer, so
            # this read could not be proven either. kcp answers it, without the freshness read.
            raise Fallback(f"cache of {ctx.api.resource} behind kcp", **_size(resource))
        rv = await _upstream_resource_version(ctx)
        started = loop.time()
    # ANY needs nothing more; the others need the cache at ``rv`` at least (an exact read at a
    # resourceVersion the cache has not reached yet, too).
    if (
        consistency is not Consistency.ANY
        and rv
        and not await resource.wait_for(rv, timeout=FRESHNESS_WAIT)
        and not watch
    ):
        if consistency is Consistency.CONSISTENT:
            resource.upstream_at(rv)
        raise Fallback(f"cache of {ctx.api.resource} behind {rv}", **_size(resource))
    if consistency is Consistency.CONSISTENT:
        ctx.metrics.cache_freshness_wait.observe(loop.time() - started)


def _size(resource: SharedResource) -> dict[str, int]:
    return {"objects": len(resource.store), "raw_bytes": resource.store.raw_bytes}


async def _cluster_served_here(ctx: ProxyRequest, resource: SharedResource) -> None:
    """:class:`Fallback` (kcp answers the request) for a named logical cluster that kcp's VW
    of this shard may not serve at all.

    kcp fact (v0.32.3, verified on the sharded bed, tests/shards/test_foreign_shards.py): the
    APIExport VW of a shard answers 403 Forbidden to LIST, WATCH, GET and writes for a logical
    cluster that has no APIBinding to the export on that shard — one that lives on another
    shard, binds nothing, or does not exist — while ``clusters/*`` shows only the shard's own
    objects. The shared cache holds ``clusters/*``: an object of the cluster there is taken as
    kcp serving it on this shard (an APIBinding's deletion deletes its objects first); without
    one, a one-item LIST of that cluster asks kcp (vwserver's identity, only its status code is
    used), and anything but 200 leaves the request to kcp, which gives its own answer.
    (Seen on the same bed and not handled here: that VW's ``clusters/*`` also shows the
    objects of a workspace bound to *another* export of the same APIResourceSchema,
    tests/shards/test_consent_auth_shards.py; a named request for that workspace is then
    served from the cache where kcp's VW may refuse it.)"""
    cluster = ctx.path.cluster
    if ctx.path.wildcard or resource.store.holds_cluster(cluster):
        return
    url = f"{kcp.clusters(ctx.upstream_base, cluster)}{api_path(ctx)}"
    async with ctx.upstream.request(
        "GET", url, query=[("limit", "1")], headers=ctx.upstream_headers()
    ) as up:
        await up.read()
        if up.status != 200:
            raise Fallback(f"upstream answered {up.status} for cluster {cluster}")


async def refuse_foreign_resource_version(ctx: ProxyRequest, rv: int) -> None:
    """410 Expired for a resourceVersion newer than the shard's current one: it cannot be
    this shard's (each shard is its own etcd; its resourceVersions are that etcd's revisions,
    which only grow), so it came from another shard's endpoint — or from nowhere.

    kcp fact (v0.32.3, the sharded bed, tests/shards/test_versions_shards.py): kcp's VW,
    given such a resourceVersion, waits for a revision its etcd has not reached — a LIST with
    ``NotOlderThan`` or ``Exact`` got no answer for at least 12 s; a WATCH from it is 200 with
    no event until its ``timeoutSeconds``, and the changes the shard makes before its etcd
    reaches that revision are older than the watch's start, so no watch from there ever sends
    them. The cache's watch would skip them the same way. vwserver answers at once instead,
    with the apiserver's "your
    resourceVersion is unusable" code that client-go's reflector handles by relisting from
    scratch (``apierrors.IsResourceExpired``). A resourceVersion of another shard that is
    *lower* than this shard's is indistinguishable from an old one of this shard: it gets the
    answer for that revision of this shard (410 when it left the window), never another
    shard's objects."""
    current = await _upstream_resource_version(ctx)
    if rv > current:
        raise Expired(
            f"resourceVersion {rv} is newer than this shard's current {current}: "
            "resourceVersions are per shard; relist through this endpoint"
        )


async def _upstream_resource_version(ctx: ProxyRequest) -> int:
    """The upstream's current resourceVersion, read with a one-item LIST across every logical
    cluster (kcp's resourceVersions are the shard's etcd revisions: one counter for all) — the
    cheapest consistent answer kcp gives (see FRESHNESS_WAIT)."""
    url = f"{ctx.upstream_base}/clusters/*{api_path(ctx)}"
    async with ctx.upstream.request(
        "GET", url, query=[("limit", "1")], headers=ctx.upstream_headers()
    ) as up:
        if up.status != 200:
            raise Fallback(f"upstream answered {up.status} to the freshness read")
        body = await up.read()
    try:
        doc = msgspec.json.decode(body)
        return int(doc["metadata"]["resourceVersion"])
    except (msgspec.DecodeError, KeyError, TypeError, ValueError) as e:
        raise Fallback(f"unusable freshness read: {e}") from e


def api_path(ctx: ProxyRequest) -> str:
    """The shared resource's collection below ``clusters/*`` (no namespace: one per resource)."""
    return replace(ctx.api, namespace="").collection_path


# --------------------------------------------------------------------------------------------
# LIST


async def list_page(
    ctx: ProxyRequest, resource: SharedResource, plan: ListPlan
) -> tuple[list[Entry], int, str]:
    """The entries the client sees on this page (in any representation), the page's
    resourceVersion and the continue token for the next one (empty on the last page)."""
    view = ctx.member
    client = client_filter(ctx)
    await ready(ctx, resource, plan.consistency, plan.rv)
    store = resource.store
    rv = plan.rv if plan.consistency is Consistency.EXACT else store.rv

    try:
        entries, last = store.page(
            rv, after=plan.after, limit=plan.limit, accept=accepts(view, client)
        )
    except WindowExpired as e:
        if plan.after is not None:
            # etcd's message for a continue token older than its compaction.
            raise Expired(
                "The provided continue parameter is too old to display a consistent list "
                "result. You can start a new list without the continue parameter."
            ) from e
        raise Expired("The resourceVersion for the provided list is too old.") from e
    origin = shard_id(ctx.upstream_base)
    token = encode_continue(Continue(rv=rv, key=last, origin=origin)) if last is not None else ""
    return entries, rv, token


async def serve_cached_list(
    ctx: ProxyRequest, resource: SharedResource, plan: ListPlan
) -> web.StreamResponse:
    view = ctx.member
    entries, rv, token = await list_page(ctx, resource, plan)
    enc = _encoder(ctx, resource)
    if enc.partial:
        kind, api_version = "PartialObjectMetadataList", _META_GROUP_VERSION
    else:
        kind, api_version = resource.list_kind, resource.api_version
    head = list_opening(
        kind=kind, api_version=api_version, resource_version=str(rv), continue_token=token
    )
    response = web.StreamResponse(status=200)
    response.content_type = "application/json"
    if not await prepare_list(ctx.request, response):
        return response
    await response.write(head)
    for start in range(0, len(entries), _WRITE_BATCH):
        batch = entries[start : start + _WRITE_BATCH]
        chunk = b",".join(enc.item(shown(view, e)) for e in batch)
        await response.write(chunk if start == 0 else b"," + chunk)
    await response.write(LIST_FOOTER)
    await response.write_eof()
    return response


# --------------------------------------------------------------------------------------------
# WATCH


@dataclass(frozen=True, slots=True)
class WatchStart:
    """Where a watch from the cache starts (in any representation)."""

    initial: list[Entry]
    """The client's state as ADDED events (empty for changes after a resourceVersion)."""
    rv: int
    subscription: Subscription | None
    """The changes after ``rv``; None when ``rv`` has left the window (``expired`` says so)."""
    expired: str = ""


def start_watch(
    resource: SharedResource, plan: WatchPlan, *, view: SliceView, client: ClientFilter
) -> WatchStart:
    """The client's initial state and its subscription, at the same resourceVersion: nothing
    awaits between the state read and the subscription's start, so no change falls between
    them."""
    store = resource.store
    initial: list[Entry] = []
    if plan.changes_after is None:
        start = store.rv
        accept = accepts(view, client)
        initial = [e for e in store.snapshot() if accept(e)]
    else:
        start = plan.changes_after
    try:
        subscription = resource.subscribe(from_rv=start, queue_size=QUEUE_SIZE)
    except WindowExpired:
        expired = f"too old resource version: {start} ({store.oldest_rv})"
        return WatchStart(initial=[], rv=start, subscription=None, expired=expired)
    return WatchStart(initial=initial, rv=start, subscription=subscription)


async def open_watch(
    ctx: ProxyRequest, start: WatchStart
) -> tuple[web.StreamResponse, Subscription | None]:
    """The watch response, its headers sent, and the subscription to stream from it; None when
    the response is complete already (a HEAD request; an expired resourceVersion)."""
    response = web.StreamResponse(status=200)
    response.content_type = "application/json"
    response.enable_chunked_encoding()
    await response.prepare(ctx.request)
    ctx.record.status = 200
    subscription = start.subscription
    if headers_only(ctx.request):
        if subscription is not None:
            subscription.close()
        await response.write_eof()
        return response, None
    if subscription is None:
        # The cacher answers a watch from a resourceVersion it no longer has with an ERROR
        # event carrying 410 Expired (not an HTTP error; a Status in every representation):
        # client-go then relists.
        status = status_body(code=410, reason="Expired", message=start.expired).rstrip(b"\n")
        await response.write(b'{"type":"ERROR","object":' + status + b"}\n")
        await response.write_eof()
    return response, subscription


async def serve_cached_watch(
    ctx: ProxyRequest, resource: SharedResource, plan: WatchPlan
) -> web.StreamResponse:
    view = ctx.member
    client = client_filter(ctx)
    await ready(ctx, resource, plan.consistency, plan.rv, watch=True)
    enc = _encoder(ctx, resource)
    start = start_watch(resource, plan, view=view, client=client)
    response, subscription = await open_watch(ctx, start)
    if subscription is None:
        return response
    shape = ctx.representation.shape
    writer = _DirectWriter(ctx.request, view=view, client=client, enc=enc, shape=shape, plan=plan)
    # Attached before the initial events: the fan-out writes for this client only once it
    # waits for changes, but a client that stops reading during its initial events must be
    # ended too when its queue overflows (the writer closes the connection then).
    subscription.attach(writer)

    def done() -> None:
        subscription.attach(None)
        writer.close()
        subscription.close()

    return await stream_watch(
        response,
        initial=(enc.event("ADDED", shown(view, e)) for e in start.initial),
        end=(lambda: enc.bookmark(start.rv, initial_events_end=True))
        if plan.initial_events_end
        else None,
        stream=lambda: _stream(
            ctx, response, subscription, writer, view=view, client=client, enc=enc, plan=plan
        ),
        done=done,
    )


async def stream_watch(
    response: web.StreamResponse,
    *,
    initial: Iterable[bytes],
    end: Callable[[], bytes] | None,
    stream: Callable[[], Awaitable[None]],
    done: Callable[[], None] | None = None,
) -> web.StreamResponse:
    """The body of a cached watch whose headers are sent: its ``initial`` events, the
    initial-events-end bookmark made by ``end`` after them (a Table's first line carries its
    column definitions; None: the client asked for no bookmark), then ``stream``
    (the live changes) and the chunked end. ``done`` runs however it ends (None: the caller
    cleans up itself); a client that went away gets nothing more."""
    try:
        await write_lines(response, initial)
        if end is not None:
            await response.write(end())
        await stream()
    except ConnectionError:
        return response
    finally:
        if done is not None:
            done()
    with contextlib.suppress(ConnectionError):
        await response.write_eof()
    return response


async def write_lines(response: web.StreamResponse, lines: Iterable[bytes]) -> None:
    batch: list[bytes] = []
    for line in lines:
        batch.append(line)
        if len(batch) >= _WRITE_BATCH:
            await response.write(b"".join(batch))
            batch.clear()
    if batch:
        await response.write(b"".join(batch))


async def _stream(
    ctx: ProxyRequest,
    response: web.StreamResponse,
    subscription: Subscription,
    writer: _DirectWriter,
    *,
    view: SliceView,
    client: ClientFilter,
    enc: _Encoder,
    plan: WatchPlan,
) -> None:
    """Live changes until the subscription ends: the watch's timeout, the route's retirement
    and the server's shutdown close it (a timer per watch, one shared waiter per event, nothing
    per change); the cache ends it when the client fell behind or the cache relisted.

    While the client keeps up, the fan-out writes its changes (:class:`_DirectWriter`) and this
    coroutine sleeps; it writes only what went through the queue — with aiohttp's
    backpressure — after what the writer took."""
    shape = ctx.representation.shape
    with watch_lifetime(ctx, subscription, seconds=plan.timeout):
        async for item in subscription:
            # What the writer took came before anything queued (its flush at the end of the
            # loop's turn comes first anyway; this does not depend on callback order).
            writer.flush()
            line = _line(item, view=view, client=client, enc=enc, shape=shape, plan=plan)
            if line:
                await response.write(line)
        writer.flush()  # what it took in the turn that ended the subscription
    if subscription.overflowed:
        log.info("watch on %s ended: the client fell behind", ctx.api.resource)


_PENDING_LIMIT: Final = 256 * 1024
"""Bytes the fan-out buffers for one client in one turn of the event loop; beyond that the
client's changes go through its queue (and are written with backpressure)."""


class _Audience:
    """The watches that send every item the same way — same slice, client filter,
    representation and bookmarks — and the line of the item being fanned out to them right
    now: computed by the first of them, reused by the others (an item is fanned out once, in
    one turn of the event loop, so the last item is all there is to remember)."""

    __slots__ = ("__weakref__", "item", "line")

    def __init__(self) -> None:
        self.item: Change | Bookmark | None = None
        self.line: bytes | None = None


_AUDIENCES: Final[weakref.WeakValueDictionary[tuple[object, ...], _Audience]] = (
    weakref.WeakValueDictionary()
)


class _DirectWriter:
    """Writes a watch's lines to its connection from the fan-out (:class:`~vwserver.cache.
    shared.DirectWriter`) — only while the connection has nothing unsent, i.e. the client
    keeps up: a client that does not read makes its connection buffer bytes, and from then on
    its changes wait in its bounded queue, are written by :func:`_stream` with aiohttp's
    backpressure, and end the watch when the queue overflows. Lines are written as HTTP/1.1
    chunks, as aiohttp frames the response's other writes (the headers went out in
    ``prepare``); a turn's lines are one write."""

    __slots__ = (
        "_audience",
        "_client",
        "_closed",
        "_enc",
        "_pending",
        "_plan",
        "_protocol",
        "_shape",
        "_size",
        "_transport",
        "_view",
    )

    def __init__(
        self,
        request: web.BaseRequest,
        *,
        view: SliceView,
        client: ClientFilter,
        enc: _Encoder,
        shape: Shape,
        plan: WatchPlan,
    ) -> None:
        self._transport = request.transport
        self._protocol = request.protocol
        self._view = view
        self._client = client
        self._enc = enc
        self._shape = shape
        self._plan = plan
        self._pending: list[bytes] = []
        self._size = 0
        self._closed = False
        key = (view, client, shape, plan.bookmarks, enc.partial, enc.item_kind, enc.api_version)
        audience = _AUDIENCES.get(key)
        if audience is None:
            audience = _AUDIENCES[key] = _Audience()
        self._audience = audience

    def take(self, item: Change | Bookmark) -> bool:
        transport = self._transport
        if (
            self._closed
            or transport is None
            or transport.is_closing()
            or transport.get_write_buffer_size()
        ):
            return False
        audience = self._audience
        if audience.item is item:
            line = audience.line
        else:
            line = _line(
                item,
                view=self._view,
                client=self._client,
                enc=self._enc,
                shape=self._shape,
                plan=self._plan,
                chunked=True,
            )
            audience.item, audience.line = item, line
        if line is None:
            return True
        size = self._size + len(line)
        if size > _PENDING_LIMIT:
            return False
        self._pending.append(line)
        self._size = size
        return True

    def flush(self) -> None:
        pending = self._pending
        if not pending:
            return
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        pending.clear()
        self._size = 0
        transport = self._transport
        if not self._closed and transport is not None and not transport.is_closing():
            transport.write(data)

    def ended(self) -> None:
        # The watch ended while its coroutine was writing: if the connection is paused that
        # write waits for a client that does not read, and neither it nor the end of the
        # response would ever go out. The connection is closed instead (the client re-watches
        # from the last resourceVersion it received, as after a clean end).
        transport = self._transport
        if transport is not None and self._protocol.writing_paused and not self._closed:
            transport.abort()

    def close(self) -> None:
        self._closed = True
        self._pending.clear()


class _Closers:
    """Closes the subscriptions registered with an event when it is set (a route's
    retirement, the server's shutdown): one waiting task per event with watches, not one per
    watch."""

    def __init__(self) -> None:
        self._by_event: dict[asyncio.Event, tuple[asyncio.Task[None], set[Subscription]]] = {}

    def add(self, event: asyncio.Event, subscription: Subscription) -> None:
        if event.is_set():
            subscription.close()
            return
        entry = self._by_event.get(event)
        if entry is None:
            members: set[Subscription] = set()
            task = asyncio.ensure_future(self._close_when_set(event, members))
            entry = self._by_event[event] = (task, members)
        entry[1].add(subscription)

    def discard(self, event: asyncio.Event, subscription: Subscription) -> None:
        entry = self._by_event.get(event)
        if entry is None:
            return
        task, members = entry
        members.discard(subscription)
        if not members:
            del self._by_event[event]
            task.cancel()

    async def _close_when_set(self, event: asyncio.Event, members: set[Subscription]) -> None:
        await event.wait()
        entry = self._by_event.get(event)
        if entry is not None and entry[1] is members:
            del self._by_event[event]
        for subscription in list(members):
            subscription.close()


_CLOSERS: Final = _Closers()
"""Closes cached watches of every representation when their route retires or the server
shuts down."""


@contextlib.contextmanager
def watch_lifetime(
    ctx: ProxyRequest, subscription: Subscription, *, seconds: float
) -> Iterator[None]:
    """While the block runs, ``subscription`` is closed after ``seconds`` (the watch's
    ``timeoutSeconds``), when the slice's route is retired, or when the server shuts down."""
    timer = asyncio.get_running_loop().call_later(seconds, subscription.close)
    _CLOSERS.add(ctx.route.retired, subscription)
    _CLOSERS.add(ctx.closing, subscription)
    try:
        yield
    finally:
        timer.cancel()
        _CLOSERS.discard(ctx.route.retired, subscription)
        _CLOSERS.discard(ctx.closing, subscription)


def _line(
    item: Change | Bookmark,
    *,
    view: SliceView,
    client: ClientFilter,
    enc: _Encoder,
    shape: Shape,
    plan: WatchPlan,
    chunked: bool = False,
) -> bytes | None:
    """The line ``item`` sends to this client (None: nothing); ``chunked``: framed as one
    HTTP/1.1 chunk, for writing to the connection directly."""
    if isinstance(item, Bookmark):
        if not plan.bookmarks:
            return None
        # Every client of the resource with this representation sends the same bookmark.
        memo = f"{enc.item_kind}/{enc.item_api_version}"
        line = item.lines.get(memo)
        if line is None:
            line = item.lines[memo] = enc.bookmark(item.rv)
    else:
        events = transition(view=view, client=client, change=item)
        if not events:
            return None
        # Every client that sends this change the same way sends the same bytes: encode once
        # (an object leaving a slice looks different to that slice's clients). A DELETED and
        # an ADDED (a leave that completed, the object back in the slice) are one line pair,
        # written at once.
        leaves = [leaving(view, entry.meta) for _, entry in events]
        kinds = "+".join(kind for kind, _ in events)
        memo = (
            f"{kinds}/{shape.value}"
            if all(since is None for since in leaves)
            else f"{kinds}/{shape.value}/{view.id}"
        )
        line = item.lines.get(memo)
        if line is None:
            line = item.lines[memo] = b"".join(
                enc.event(kind, entry.raw if since is None else as_leaving(entry.raw, since))
                for (kind, entry), since in zip(events, leaves, strict=True)
            )
    if not chunked:
        return line
    framed = item.lines.get(memo + "/chunk")
    if framed is None:
        framed = item.lines[memo + "/chunk"] = b"%x\r\n%b\r\n" % (len(line), line)
    return framed


def shown(view: SliceView, entry: Entry) -> bytes:
    """The entry's bytes as the slice ``view`` shows them: as stored, or being deleted when the
    object is leaving the slice (:func:`vwserver.holds.as_leaving`)."""
    since = leaving(view, entry.meta)
    return entry.raw if since is None else as_leaving(entry.raw, since)
