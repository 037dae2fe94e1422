"""Decide, per object and per watch event, what may leave the proxy — pure, no I/O.

The proxy pushes every selector down to the upstream *and* checks every object itself: the
upstream's filtering is an optimisation, this module is the guarantee (issue #2). Objects are
decoded only as far as their head (apiVersion, kind, metadata) with msgspec, and matching objects
are forwarded as their original bytes, so each object is parsed once and never re-encoded.

Watch events follow the apiserver's label-selector watch semantics (the watch cache's
``cacheWatcher.convertToWatchEvent``): an object that stops matching arrives as DELETED carrying
its *previous* (still matching) content, one that starts matching as ADDED. With the selector
pushed down, every event from a correct upstream therefore matches. An event that does not is
handled so that no field of an object outside the slice leaves the proxy:

=================  =================================================================
upstream event     sent to the client
=================  =================================================================
ADDED, no match    nothing (the client never saw it)
MODIFIED, no match a synthetic DELETED with identifying metadata only: the object may
                   have been visible before, and a client must not keep a stale copy
DELETED, no match  a synthetic DELETED with identifying metadata only
BOOKMARK, ERROR    passed through unchanged (a bookmark carries no object data; the
                   ``k8s.io/initial-events-end`` annotation must reach client-go)
=================  =================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from vwserver.k8s.types import (
    ListLabels,
    ListPage,
    ObjectHead,
    TableLabels,
    TablePage,
    WatchEventHead,
    WatchEventLabels,
)
from vwserver.selector import Selector

CLUSTER_ANNOTATION = "kcp.io/cluster"

_head_decoder = msgspec.json.Decoder(ObjectHead)
_event_decoder = msgspec.json.Decoder(WatchEventHead)
_event_labels_decoder = msgspec.json.Decoder(WatchEventLabels)
_list_decoder = msgspec.json.Decoder(ListPage)
_table_decoder = msgspec.json.Decoder(TablePage)
_list_labels_decoder = msgspec.json.Decoder(ListLabels)
_table_labels_decoder = msgspec.json.Decoder(TableLabels)
_encoder = msgspec.json.Encoder()
_EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})


class UndecodableError(ValueError):
    """Upstream bytes that are not the JSON we expect (garbage, truncated, wrong shape)."""


def decode_head(raw: bytes | msgspec.Raw) -> ObjectHead:
    try:
        return _head_decoder.decode(raw)
    except msgspec.DecodeError as e:
        raise UndecodableError(str(e)) from e


@dataclass(slots=True)
class Page:
    """One decoded upstream page: plain list / PartialObjectMetadataList, or Table."""

    is_table: bool
    api_version: str
    kind: str
    resource_version: str
    continue_token: str
    column_definitions: bytes | None
    entries: list[msgspec.Raw]
    """Items (lists) or rows (Tables), still raw."""
    labels: list[dict[str, str] | _NoObject | None]
    """Each entry's labels; a Table row without an embedded object can never be shown."""

    def visible(self, selector: Selector) -> list[msgspec.Raw]:
        """The raw entries that match ``selector``, to be joined as they are (``msgspec.Raw``
        supports the buffer protocol, so ``b",".join`` copies each entry exactly once)."""
        matches = selector.matches
        return [
            entry
            for entry, labels in zip(self.entries, self.labels, strict=True)
            if not isinstance(labels, _NoObject) and matches(labels)
        ]


class _NoObject:
    """Marks a Table row that embeds no object (``includeObject=None``): never visible."""


_NO_OBJECT = _NoObject()


def decode_page(body: bytes) -> Page:
    """Decode one LIST page, Table or not: entries kept raw, their labels decoded.

    Two passes of msgspec over the page (one keeping raw entries, one reading only labels) cost
    less than decoding each entry separately from Python.
    """
    try:
        head = _head_decoder.decode(body)
        if head.kind == "Table":
            table = _table_decoder.decode(body)
            rows = _table_labels_decoder.decode(body).rows or []
            return Page(
                is_table=True,
                api_version=table.apiVersion,
                kind=table.kind,
                resource_version=table.metadata.resourceVersion,
                continue_token=table.metadata.continue_,
                column_definitions=bytes(table.columnDefinitions),
                entries=table.rows or [],
                labels=[_NO_OBJECT if r.object is None else r.object.metadata.labels for r in rows],
            )
        page = _list_decoder.decode(body)
        items = _list_labels_decoder.decode(body).items or []
    except msgspec.DecodeError as e:
        raise UndecodableError(str(e)) from e
    if not page.kind.endswith("List"):
        raise UndecodableError(f"expected a list, got kind {page.kind!r}")
    return Page(
        is_table=False,
        api_version=page.apiVersion,
        kind=page.kind,
        resource_version=page.metadata.resourceVersion,
        continue_token=page.metadata.continue_,
        column_definitions=None,
        entries=page.items or [],
        labels=[i.metadata.labels for i in items],
    )


def list_header(page: Page, *, resource_version: str, continue_token: str) -> bytes:
    """The opening of a streamed list response, up to and including the ``[`` of its entries.

    ``remainingItemCount`` is dropped: it counts upstream objects, and with the proxy's own
    check it could count objects the client may not see.
    """
    metadata: dict[str, str] = {"resourceVersion": resource_version}
    if continue_token:
        metadata["continue"] = continue_token
    head = (
        b'{"kind":'
        + _encoder.encode(page.kind)
        + b',"apiVersion":'
        + _encoder.encode(page.api_version)
        + b',"metadata":'
        + _encoder.encode(metadata)
    )
    if page.is_table:
        return head + b',"columnDefinitions":' + (page.column_definitions or b"[]") + b',"rows":['
    return head + b',"items":['


LIST_FOOTER = b"]}\n"


def synthetic_deleted(head: ObjectHead) -> bytes:
    """A DELETED event that identifies the object and says nothing else about it."""
    meta: dict[str, object] = {"name": head.metadata.name}
    if head.metadata.namespace:
        meta["namespace"] = head.metadata.namespace
    if head.metadata.uid:
        meta["uid"] = head.metadata.uid
    if head.metadata.resourceVersion:
        meta["resourceVersion"] = head.metadata.resourceVersion
    cluster = (head.metadata.annotations or {}).get(CLUSTER_ANNOTATION)
    if cluster:
        meta["annotations"] = {CLUSTER_ANNOTATION: cluster}
    obj = {"apiVersion": head.apiVersion, "kind": head.kind, "metadata": meta}
    return _encoder.encode({"type": "DELETED", "object": obj}) + b"\n"


@dataclass(frozen=True, slots=True)
class EventVerdict:
    """What to do with one upstream watch line."""

    forward: bool = False
    """Send the original line unchanged."""
    replacement: bytes | None = None
    """Send this instead (a synthetic DELETED); nothing at all if neither is set."""


_FORWARD = EventVerdict(forward=True)
_DROP = EventVerdict()


def filter_event(line: bytes | memoryview, selector: Selector) -> EventVerdict:
    """Decide one watch event (one JSON line, newline included). Raises UndecodableError.

    The common case — a matching event — costs one decode that reads only the type and the
    labels; the object's identity is decoded only when a synthetic DELETED has to be made.
    """
    try:
        event = _event_labels_decoder.decode(line)
    except msgspec.DecodeError as e:
        raise UndecodableError(str(e)) from e
    kind = event.type
    if kind not in _EVENT_TYPES:
        raise UndecodableError(f"unknown watch event type {kind!r}")
    if kind in ("BOOKMARK", "ERROR") or selector.matches(event.object.metadata.labels):
        return _FORWARD
    if kind == "ADDED":
        return _DROP
    try:
        head = _event_decoder.decode(line).object
    except msgspec.DecodeError as e:
        raise UndecodableError(str(e)) from e
    return EventVerdict(replacement=synthetic_deleted(head))
