"""Typed views of the raw Kubernetes payloads vwserver reads.

The proxy never needs a whole object: it needs labels, identity and a few list fields. These
msgspec Structs decode *only* those fields (msgspec skips everything else without building it),
which is what keeps "parse once, forward the original bytes" cheap. ``msgspec.Raw`` fields hold the
untouched bytes of a sub-document so they can be forwarded verbatim.
"""

from __future__ import annotations

import msgspec


class ObjectMeta(msgspec.Struct, omit_defaults=True):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resourceVersion: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    finalizers: list[str] | None = None
    deletionTimestamp: str | None = None


class ObjectHead(msgspec.Struct, omit_defaults=True):
    """apiVersion, kind and metadata of any object; the rest of it is skipped when decoding."""

    apiVersion: str = ""
    kind: str = ""
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)


class ListMeta(msgspec.Struct, omit_defaults=True):
    resourceVersion: str = ""
    # ``continue`` is a Python keyword; ``rename`` maps the wire name.
    continue_: str = msgspec.field(default="", name="continue")


class ListPage(msgspec.Struct):
    """One page of a LIST (plain list or PartialObjectMetadataList); items kept as raw bytes."""

    apiVersion: str = ""
    kind: str = ""
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[msgspec.Raw] | None = None


class TablePage(msgspec.Struct):
    """One page of a ``meta.k8s.io/v1 Table`` (``as=Table``); rows kept as raw bytes."""

    apiVersion: str = ""
    kind: str = ""
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    columnDefinitions: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"[]"))
    rows: list[msgspec.Raw] | None = None


class _Labels(msgspec.Struct):
    labels: dict[str, str] | None = None


class LabelsOnly(msgspec.Struct):
    """Just ``metadata.labels`` of an object; everything else is skipped while decoding."""

    metadata: _Labels = msgspec.field(default_factory=_Labels)


class ListLabels(msgspec.Struct):
    """The labels of every item of a list page, decoded in one pass over the page."""

    items: list[LabelsOnly] | None = None


class _RowLabels(msgspec.Struct):
    object: LabelsOnly | None = None


class TableLabels(msgspec.Struct):
    """The labels of the object embedded in every row of a Table page."""

    rows: list[_RowLabels] | None = None


class _EventObject(msgspec.Struct):
    """An event's object as far as the filter reads it: its kind, its labels, and — for a
    Table (``kubectl get -w``) — the labels of the object embedded in each row."""

    kind: str = ""
    metadata: _Labels = msgspec.field(default_factory=_Labels)
    rows: list[_RowLabels] | None = None


class WatchEventLabels(msgspec.Struct):
    """A watch event's type and its object's labels: all the hot path of a watch decodes."""

    type: str
    object: _EventObject


class WatchEventHead(msgspec.Struct):
    """A watch event with its object's head (for a synthetic DELETED)."""

    type: str
    object: ObjectHead
