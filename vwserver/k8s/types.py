"""Typed views of the raw Kubernetes payloads vwserver reads.

The proxy never needs a whole object: it needs labels, identity and a few list fields. These
msgspec Structs decode *only* those fields (msgspec skips everything else without building it),
which is what keeps "parse once, forward the original bytes" cheap. ``msgspec.Raw`` fields hold the
untouched bytes of a sub-document so they can be forwarded verbatim.
"""

from __future__ import annotations

import msgspec


class ObjectMeta(msgspec.Struct, omit_defaults=True, gc=False):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resourceVersion: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    finalizers: list[str] | None = None
    deletionTimestamp: str | None = None


class ObjectHead(msgspec.Struct, omit_defaults=True, gc=False):
    """apiVersion, kind and metadata of any object; the rest of it is skipped when decoding."""

    apiVersion: str = ""
    kind: str = ""
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)


class ListMeta(msgspec.Struct, omit_defaults=True, gc=False):
    resourceVersion: str = ""
    # ``continue`` is a Python keyword; ``rename`` maps the wire name.
    continue_: str = msgspec.field(default="", name="continue")


class ListPage(msgspec.Struct, gc=False):
    """One page of a LIST (plain list or PartialObjectMetadataList); items kept as raw bytes."""

    apiVersion: str = ""
    kind: str = ""
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[msgspec.Raw] | None = None


class TablePage(msgspec.Struct, gc=False):
    """One page of a ``meta.k8s.io/v1 Table`` (``as=Table``); rows kept as raw bytes."""

    apiVersion: str = ""
    kind: str = ""
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    columnDefinitions: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"[]"))
    rows: list[msgspec.Raw] | None = None
