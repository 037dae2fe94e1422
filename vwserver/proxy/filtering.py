"""Decide, per object and per watch event, what may leave the proxy — pure, no I/O.

The proxy pushes every selector down to the upstream *and* checks every object itself: the
upstream's filtering is an optimisation, this module is the guarantee. Objects are
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

The same holds in every representation: in a Table watch the object inside the event's row is
matched, and a synthetic DELETED is itself a Table (:func:`filter_event`).

Membership is more than the selector for an object that slices hold (:mod:`vwserver.holds`):
an object another slice holds and no longer matches is not shown even where the selector
matches. Only objects that carry the holds annotation need that check; the rest are told
apart by a byte search, so the common case costs nothing more (:func:`hidden_by_holds`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from vwserver.holds import (
    HOLDS_ANNOTATION,
    Member,
    as_leaving,
    client_labels,
    leaving_since,
    sees,
)
from vwserver.k8s.kcp import CLUSTER_ANNOTATION
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

_head_decoder = msgspec.json.Decoder(ObjectHead)
_event_decoder = msgspec.json.Decoder(WatchEventHead)
_event_labels_decoder = msgspec.json.Decoder(WatchEventLabels)
_list_decoder = msgspec.json.Decoder(ListPage)
_table_decoder = msgspec.json.Decoder(TablePage)
_list_labels_decoder = msgspec.json.Decoder(ListLabels)
_table_labels_decoder = msgspec.json.Decoder(TableLabels)
_encoder = msgspec.json.Encoder()
_EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})
# Searches a buffer (bytes, memoryview, msgspec.Raw) without copying it.
_HOLDS_KEY: Final = re.compile(re.escape(HOLDS_ANNOTATION.encode()))


def hidden_by_holds(raw: Any, member: Member | None) -> bool:
    """Whether the object ``raw`` (an object, a watch event's line, or a Table row embedding
    an object) carries holds that keep it from ``member`` although its labels match
    (:func:`vwserver.holds.sees`)."""
    if member is None or _HOLDS_KEY.search(raw) is None:
        return False
    meta = _embedded_head(raw)[0].metadata
    labels, annotations, finalizers = meta.labels, meta.annotations, meta.finalizers
    return not sees(member, labels=labels, annotations=annotations, finalizers=finalizers)


def _embedded_head(raw: Any) -> tuple[ObjectHead, bool]:
    """The head of the object in ``raw`` — itself, the object of a watch event's line, or the
    object a Table row embeds — and whether it was embedded in a row or event."""
    try:
        row = _row_decoder.decode(raw)
        if row.object is not None:
            return row.object, True
        return _head_decoder.decode(raw), False
    except msgspec.DecodeError as e:
        raise UndecodableError(str(e)) from e


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

    def visible(self, selector: Selector, member: Member | None = None) -> list[msgspec.Raw]:
        """The raw entries that match ``selector`` (and that holds do not keep from
        ``member``), to be joined as they are (``msgspec.Raw`` supports the buffer protocol,
        so ``b",".join`` copies each entry exactly once)."""
        matches = selector.matches
        return [
            entry
            for entry, labels in zip(self.entries, self.labels, strict=True)
            if not isinstance(labels, _NoObject)
            and matches(labels)
            and not hidden_by_holds(entry, member)
        ]

    def members(self, member: Member, client: Selector) -> list[bytes | msgspec.Raw]:
        """The entries ``member`` sees (:func:`vwserver.holds.sees`) that match the client's
        ``client`` selector, for a page read without the slice's selector: objects the slice
        holds are there whatever their labels. An object leaving the slice is shown being
        deleted (:func:`vwserver.holds.as_leaving`; a Table row as kcp printed it)."""
        matches, own = client.matches, member.selector.matches
        out: list[bytes | msgspec.Raw] = []
        for entry, labels in zip(self.entries, self.labels, strict=True):
            if isinstance(labels, _NoObject):
                continue
            if _HOLDS_KEY.search(entry) is None:
                if matches(labels) and own(labels):
                    out.append(entry)
                continue
            head, in_row = _embedded_head(entry)
            labels, annotations, finalizers = (
                head.metadata.labels,
                head.metadata.annotations,
                head.metadata.finalizers,
            )
            if not sees(member, labels=labels, annotations=annotations, finalizers=finalizers):
                continue
            # An object leaving the slice is matched by the labels it had as the slice last
            # saw it (a client selecting by the slice's own label must see the deletion).
            shown = client_labels(
                member, labels=labels, annotations=annotations, finalizers=finalizers
            )
            if not matches(shown):
                continue
            since = leaving_since(
                member, labels=labels, annotations=annotations, finalizers=finalizers
            )
            out.append(entry if since is None or in_row else as_leaving(bytes(entry), since))
        return out


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


def list_fields(page: Page, *, resource_version: str, continue_token: str) -> dict[str, Any]:
    """A list response's fields other than its entries (decoded; for YAML output).

    ``remainingItemCount`` is dropped: it counts upstream objects, and with the proxy's own
    check it could count objects the client may not see.
    """
    metadata: dict[str, str] = {"resourceVersion": resource_version}
    if continue_token:
        metadata["continue"] = continue_token
    fields: dict[str, Any] = {
        "kind": page.kind,
        "apiVersion": page.api_version,
        "metadata": metadata,
    }
    if page.is_table:
        fields["columnDefinitions"] = msgspec.json.decode(page.column_definitions or b"[]")
    return fields


def list_header(page: Page, *, resource_version: str, continue_token: str) -> bytes:
    """The opening of a streamed JSON list response, up to and including the ``[`` of its
    entries (the fields of :func:`list_fields`, in the apiserver's key order)."""
    return list_opening(
        kind=page.kind,
        api_version=page.api_version,
        resource_version=resource_version,
        continue_token=continue_token,
        column_definitions=(page.column_definitions or b"[]") if page.is_table else None,
    )


def list_opening(
    *,
    kind: str,
    api_version: str,
    resource_version: str,
    continue_token: str,
    column_definitions: bytes | None = None,
) -> bytes:
    """:func:`list_header` from its parts; with ``column_definitions`` a Table (its rows)."""
    metadata: dict[str, str] = {"resourceVersion": resource_version}
    if continue_token:
        metadata["continue"] = continue_token
    head = (
        b'{"kind":'
        + _encoder.encode(kind)
        + b',"apiVersion":'
        + _encoder.encode(api_version)
        + b',"metadata":'
        + _encoder.encode(metadata)
    )
    if column_definitions is not None:
        return head + b',"columnDefinitions":' + column_definitions + b',"rows":['
    return head + b',"items":['


LIST_FOOTER = b"]}\n"


def synthetic_deleted(head: ObjectHead) -> bytes:
    """A DELETED event that identifies the object and says nothing else about it."""
    return _encoder.encode({"type": "DELETED", "object": _identity(head)}) + b"\n"


def _identity(head: ObjectHead) -> dict[str, object]:
    """The object reduced to what identifies it (kind, name, namespace, uid, resourceVersion,
    its ``kcp.io/cluster``)."""
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
    return {"apiVersion": head.apiVersion, "kind": head.kind, "metadata": meta}


@dataclass(frozen=True, slots=True)
class EventVerdict:
    """What to do with one upstream watch line."""

    forward: bool = False
    """Send the original line unchanged."""
    replacement: bytes | None = None
    """Send this instead (a synthetic DELETED); nothing at all if neither is set."""


_FORWARD = EventVerdict(forward=True)
_DROP = EventVerdict()


def filter_event(
    line: bytes | memoryview,
    selector: Selector,
    *,
    strip_objects: bool = False,
    member: Member | None = None,
) -> EventVerdict:
    """Decide one watch event (one JSON line, newline included). Raises UndecodableError.

    The common case — a matching event — costs one decode that reads only the type and the
    labels; the object's identity is decoded only when a synthetic DELETED has to be made.

    In a Table watch (``Accept: ...;as=Table``) the event's object is a Table whose row embeds
    the object (a PartialObjectMetadata unless ``includeObject=Object``); the row's object is
    what is matched, and a Table with no row object at all is never shown. ``strip_objects``
    (the client asked for ``includeObject=None``) removes the row objects after matching.
    """
    try:
        event = _event_labels_decoder.decode(line)
    except msgspec.DecodeError as e:
        raise UndecodableError(str(e)) from e
    kind = event.type
    if kind not in _EVENT_TYPES:
        raise UndecodableError(f"unknown watch event type {kind!r}")
    if kind in ("BOOKMARK", "ERROR"):
        return _FORWARD
    obj = event.object
    if obj.kind == "Table":
        rows = obj.rows or []
        visible = (
            bool(rows)
            and all(
                r.object is not None and selector.matches(r.object.metadata.labels) for r in rows
            )
            and not _rows_hidden(line, member)
        )
        if visible:
            return (
                EventVerdict(replacement=_without_row_objects(line)) if strip_objects else _FORWARD
            )
        if kind == "ADDED":
            return _DROP
        return EventVerdict(replacement=_synthetic_table_deleted(line))
    if selector.matches(obj.metadata.labels) and not hidden_by_holds(line, member):
        return _FORWARD
    if kind == "ADDED":
        return _DROP
    try:
        head = _event_decoder.decode(line).object
    except msgspec.DecodeError as e:
        raise UndecodableError(str(e)) from e
    return EventVerdict(replacement=synthetic_deleted(head))


class _TableRowHead(msgspec.Struct):
    object: ObjectHead | None = None


class _TableHead(msgspec.Struct):
    apiVersion: str = ""
    kind: str = ""
    rows: list[_TableRowHead] | None = None


_table_rows_decoder = msgspec.json.Decoder(_TableHead)
_row_decoder = msgspec.json.Decoder(_TableRowHead)


def _rows_hidden(line: bytes | memoryview, member: Member | None) -> bool:
    """Whether holds keep any row's object of a Table watch event from ``member``."""
    if member is None or _HOLDS_KEY.search(line) is None:
        return False
    try:
        rows = _table_event_decoder.decode(line).object.rows or []
    except msgspec.DecodeError as e:
        raise UndecodableError(str(e)) from e
    return any(
        r.object is not None
        and not sees(
            member,
            labels=r.object.metadata.labels,
            annotations=r.object.metadata.annotations,
            finalizers=r.object.metadata.finalizers,
        )
        for r in rows
    )


def decode_table_rows(body: bytes) -> list[_TableRowHead]:
    """The rows of a Table with each embedded object's metadata (labels, annotations,
    finalizers: what membership needs)."""
    try:
        return _table_rows_decoder.decode(body).rows or []
    except msgspec.DecodeError as e:
        raise UndecodableError(str(e)) from e


class _TableEventHead(msgspec.Struct):
    type: str
    object: _TableHead


_table_event_decoder = msgspec.json.Decoder(_TableEventHead)


def _synthetic_table_deleted(line: bytes | memoryview) -> bytes:
    """A DELETED Table event whose one row names the object and says nothing else (its cells
    hold the name only; ``kubectl get -w`` prints the name column)."""
    try:
        event = _table_event_decoder.decode(line)
    except msgspec.DecodeError as e:
        raise UndecodableError(str(e)) from e
    rows = []
    for row in event.object.rows or []:
        if row.object is None:
            continue
        rows.append({"cells": [row.object.metadata.name], "object": _identity(row.object)})
    table: dict[str, object] = {
        "kind": "Table",
        "apiVersion": event.object.apiVersion,
        "metadata": {},
        "columnDefinitions": None,
        "rows": rows,
    }
    return _encoder.encode({"type": "DELETED", "object": table}) + b"\n"


def _without_row_objects(line: bytes | memoryview) -> bytes:
    event = msgspec.json.decode(line)
    for row in event.get("object", {}).get("rows") or []:
        row["object"] = None
    return _encoder.encode(event) + b"\n"


def strip_row_object(row: bytes | msgspec.Raw) -> bytes:
    """One Table row without its embedded object (``includeObject=None``: the apiserver writes
    ``"object": null``, as metav1.TableRow has no omitempty there)."""
    decoded = msgspec.json.decode(row)
    decoded["object"] = None
    return _encoder.encode(decoded)
