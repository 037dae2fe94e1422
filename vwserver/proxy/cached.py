"""LIST and WATCH served from the shared watch cache (:mod:`vwserver.cache`).

The request was parsed and admitted like any other; :func:`~vwserver.proxy.cache_plan.
cacheable` decided that the cache can answer it exactly. What the client sees is computed here
from the cache's state and event window: the slice's membership (:func:`vwserver.cache.views.
visible`) and the client's own selectors, applied in process, in the representation the client
negotiated (plain objects or PartialObjectMetadata). Objects leave as the bytes kcp sent.

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
from collections.abc import Iterable
from dataclasses import replace
from typing import Final

import msgspec
from aiohttp import web

from vwserver.cache.entries import Change, Entry
from vwserver.cache.shared import Bookmark, SharedResource, Subscription
from vwserver.cache.store import Expired as WindowExpired
from vwserver.cache.views import ClientFilter, SliceView, accepts, parse_field_selector, transition
from vwserver.errors import BadRequest, Expired, SelectorError
from vwserver.k8s.kcp import ORIGINAL_API_VERSION_ANNOTATION
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
# the cache has not reached. kcp's resourceVersions count every write of the shard, so kcp's
# current one moves with writes to other resources too, and the cache learns that it has
# "caught up" with them only from kcp's bookmarks (about one a minute). The apiserver's own
# cache asks etcd for a progress notification instead; a client of kcp cannot. So the wait
# covers only this resource's events in flight; beyond that kcp answers (correct, just not
# faster).
SYNC_WAIT: Final = 10.0
FRESHNESS_WAIT: Final = 0.05
QUEUE_SIZE: Final = 1024
"""Changes a watch may fall behind before it is ended (the client re-watches)."""
_WRITE_BATCH: Final = 256

_META_GROUP_VERSION: Final = "meta.k8s.io/v1"
_encode = msgspec.json.Encoder().encode


class Fallback(Exception):
    """The cache cannot answer this request exactly right now: use the pass-through path."""


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

    def __init__(self, *, shape: Shape, kind: str, api_version: str) -> None:
        self.partial = shape is not Shape.OBJECT
        self.item_kind = "PartialObjectMetadata" if self.partial else kind
        self.item_api_version = _META_GROUP_VERSION if self.partial else api_version
        self.api_version = api_version

    def item(self, raw: bytes) -> bytes:
        if not self.partial:
            return raw
        # kcp names the object's own apiVersion in an annotation of its PartialObjectMetadata:
        # the metadata is decoded (only it) to add that one member.
        metadata = msgspec.json.decode(_decode_metadata(raw).metadata)
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
    )


# --------------------------------------------------------------------------------------------
# Waiting for the cache (before any byte goes out)


async def _ready(
    ctx: ProxyRequest, resource: SharedResource, consistency: Consistency, rv: int
) -> None:
    """Wait until the cache may answer with ``consistency``; :class:`Fallback` otherwise."""
    if not await resource.wait_synced(SYNC_WAIT):
        raise Fallback(f"cache of {ctx.api.resource} not synced: {resource.last_error}")
    loop = asyncio.get_running_loop()
    if consistency is Consistency.CONSISTENT:
        rv = await _upstream_resource_version(ctx)
        started = loop.time()
    # ANY needs nothing more; the others need the cache at ``rv`` at least (an exact read at a
    # resourceVersion the cache has not reached yet, too).
    if (
        consistency is not Consistency.ANY
        and rv
        and not await resource.wait_for(rv, timeout=FRESHNESS_WAIT)
    ):
        raise Fallback(f"cache of {ctx.api.resource} behind {rv}")
    if consistency is Consistency.CONSISTENT:
        ctx.metrics.cache_freshness_wait.observe(loop.time() - started)


async def _upstream_resource_version(ctx: ProxyRequest) -> int:
    """The upstream's current resourceVersion, read with a one-item LIST across every logical
    cluster (kcp's resourceVersions are the shard's etcd revisions: one counter for all)."""
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


async def serve_cached_list(
    ctx: ProxyRequest, resource: SharedResource, plan: ListPlan
) -> web.StreamResponse:
    view = SliceView(selector=ctx.route.selector)
    client = client_filter(ctx)
    await _ready(ctx, resource, plan.consistency, plan.rv)
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
    token = encode_continue(Continue(rv=rv, key=last)) if last is not None else ""
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
        chunk = b",".join(enc.item(e.raw) for e in batch)
        await response.write(chunk if start == 0 else b"," + chunk)
    await response.write(LIST_FOOTER)
    await response.write_eof()
    return response


# --------------------------------------------------------------------------------------------
# WATCH


async def serve_cached_watch(
    ctx: ProxyRequest, resource: SharedResource, plan: WatchPlan
) -> web.StreamResponse:
    view = SliceView(selector=ctx.route.selector)
    client = client_filter(ctx)
    await _ready(ctx, resource, plan.consistency, plan.rv)
    store = resource.store
    enc = _encoder(ctx, resource)
    initial: list[Entry] = []
    expired: str | None = None
    # From here to subscribe() nothing awaits: the state read and the subscription's start
    # are the same resourceVersion, so no change falls between them.
    if plan.changes_after is None:
        start = store.rv
        accept = accepts(view, client)
        initial = [e for e in store.snapshot() if accept(e)]
    else:
        start = plan.changes_after
    try:
        subscription = resource.subscribe(from_rv=start, queue_size=QUEUE_SIZE)
    except WindowExpired:
        # The cacher answers a watch from a resourceVersion it no longer has with an ERROR
        # event carrying 410 Expired (not an HTTP error): client-go then relists.
        expired = f"too old resource version: {start} ({store.oldest_rv})"
        subscription = None
    response = web.StreamResponse(status=200)
    response.content_type = "application/json"
    response.enable_chunked_encoding()
    await response.prepare(ctx.request)
    ctx.record.status = 200
    if headers_only(ctx.request):
        if subscription is not None:
            subscription.close()
        await response.write_eof()
        return response
    if subscription is None:
        status = status_body(code=410, reason="Expired", message=expired or "").rstrip(b"\n")
        await response.write(b'{"type":"ERROR","object":' + status + b"}\n")
        await response.write_eof()
        return response
    try:
        await _write_lines(response, (enc.event("ADDED", e.raw) for e in initial))
        if plan.initial_events_end:
            await response.write(enc.bookmark(start, initial_events_end=True))
        await _stream(ctx, response, subscription, view=view, client=client, enc=enc, plan=plan)
    finally:
        subscription.close()
    with contextlib.suppress(ConnectionError):
        await response.write_eof()
    return response


async def _write_lines(response: web.StreamResponse, lines: Iterable[bytes]) -> None:
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
    *,
    view: SliceView,
    client: ClientFilter,
    enc: _Encoder,
    plan: WatchPlan,
) -> None:
    """Live changes until the subscription ends: the watch's timeout, the route's retirement
    and the server's shutdown close it (one helper task per watch, nothing per event); the
    cache ends it when the client fell behind or the cache relisted."""
    shape = ctx.representation.shape
    loop = asyncio.get_running_loop()
    timer = loop.call_later(plan.timeout, subscription.close)
    closer = asyncio.ensure_future(_close_when_ended(ctx, subscription))
    try:
        async for item in subscription:
            line = _line(item, view=view, client=client, enc=enc, shape=shape, plan=plan)
            if line:
                await response.write(line)
    finally:
        timer.cancel()
        closer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await closer
    if subscription.overflowed:
        log.info("watch on %s ended: the client fell behind", ctx.api.resource)


async def _close_when_ended(ctx: ProxyRequest, subscription: Subscription) -> None:
    """Close ``subscription`` when the slice's route is retired or the server shuts down."""
    retired = asyncio.ensure_future(ctx.route.retired.wait())
    closing = asyncio.ensure_future(ctx.closing.wait())
    try:
        await asyncio.wait([retired, closing], return_when=asyncio.FIRST_COMPLETED)
        subscription.close()
    finally:
        for waiter in (retired, closing):
            waiter.cancel()
        await asyncio.gather(retired, closing, return_exceptions=True)


def _line(
    item: Change | Bookmark,
    *,
    view: SliceView,
    client: ClientFilter,
    enc: _Encoder,
    shape: Shape,
    plan: WatchPlan,
) -> bytes | None:
    if isinstance(item, Bookmark):
        return enc.bookmark(item.rv) if plan.bookmarks else None
    verdict = transition(view=view, client=client, change=item)
    if verdict is None:
        return None
    kind, entry = verdict
    memo = f"{kind}/{shape.value}"
    # Every client that sends this change the same way sends the same bytes: encode once.
    line = item.lines.get(memo)
    if line is None:
        line = item.lines[memo] = enc.event(kind, entry.raw)
    return line
