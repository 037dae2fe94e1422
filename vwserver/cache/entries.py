"""What the shared watch cache stores per object, and per change — pure types, no I/O.

An object is decoded once, when it arrives from the upstream: its metadata into :class:`Meta`
(everything a view needs to decide membership and a client's selectors), while the object itself
is kept as its original bytes and forwarded as they are. ``msgspec.Raw`` slices of a list page
would keep the whole page alive as long as any one of its objects is stored, so :func:`entry`
copies each object's bytes out of the page.

Memory: the decoded metadata costs more than many an object's bytes, and most of it repeats —
thousands of objects share a handful of label sets, their logical cluster and namespace, and
annotations that are often only ``kcp.io/cluster``. An :class:`Interner` (one per shared
resource) makes objects with equal label sets, annotations, clusters and namespaces share one
copy. What stays per object is its bytes, its name, its resourceVersion and two small fixed
structures (msgspec Structs without a GC header), plus its place in the store's sorted list:
about 245 bytes besides the JSON. Nothing else is kept — not even the uid, which no view reads,
nor a key tuple (:attr:`Meta.key` is built when asked).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Final, Literal

import msgspec

from vwserver.k8s.kcp import CLUSTER_ANNOTATION
from vwserver.k8s.types import ObjectMeta

ChangeType = Literal["ADDED", "MODIFIED", "DELETED"]


class _ObjectWire(msgspec.Struct):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)


_decode_object: Final = msgspec.json.Decoder(_ObjectWire).decode

_NO_LABELS: Final[dict[str, str]] = {}


Key = tuple[str, str, str]
"""(logical cluster, namespace, name): an object's identity across every consumer workspace of
an APIExport virtual workspace (names repeat across clusters)."""


class Meta(msgspec.Struct, frozen=True, gc=False):
    """An object's metadata as the views read it.

    A frozen msgspec Struct rather than a dataclass: one is built per object and event, and a
    Struct is built ~20 times faster and is smaller (``gc=False``: it holds only strings, ints
    and containers of strings, so it can be in no reference cycle)."""

    cluster: str
    """The object's logical cluster (its ``kcp.io/cluster`` annotation)."""
    namespace: str
    name: str
    resource_version: int
    labels: dict[str, str]
    annotations: dict[str, str]
    finalizers: tuple[str, ...]
    deletion_timestamp: str | None

    @property
    def key(self) -> Key:
        """Built when asked: a stored tuple would cost 64 bytes per object, for comparisons
        that happen once per upstream event and page."""
        return (self.cluster, self.namespace, self.name)


class UndecodableObject(ValueError):
    """Upstream bytes that are no object with metadata (or have no integer resourceVersion)."""


class Interner:
    """Shares equal label sets, annotations and finalizer lists between the objects of one
    resource (the dicts are never mutated: :class:`Meta` is read-only by contract). Bounded: a
    table that reaches ``limit`` distinct values starts over (objects keep what they share)."""

    def __init__(self, *, limit: int = 16384) -> None:
        self.limit = limit
        self._maps: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
        self._tuples: dict[tuple[str, ...], tuple[str, ...]] = {}

    def __len__(self) -> int:
        return len(self._maps) + len(self._tuples)

    def mapping(self, value: dict[str, str] | None) -> dict[str, str]:
        if not value:
            return _NO_LABELS
        key = tuple(value.items())  # the apiserver writes maps sorted: equal maps, equal keys
        shared = self._maps.get(key)
        if shared is not None:
            return shared
        if len(self._maps) >= self.limit:
            self._maps.clear()
        # Values repeat across different label sets too ("prod", a cluster name).
        value = {sys.intern(k): sys.intern(v) if len(v) <= 64 else v for k, v in key}
        self._maps[key] = value
        return value

    def strings(self, value: list[str] | None) -> tuple[str, ...]:
        if not value:
            return ()
        key = tuple(value)
        shared = self._tuples.get(key)
        if shared is not None:
            return shared
        if len(self._tuples) >= self.limit:
            self._tuples.clear()
        self._tuples[key] = key
        return key


def decode_meta(raw: bytes | msgspec.Raw, *, interner: Interner | None = None) -> Meta:
    """The :class:`Meta` of one object's JSON (sharing repeated parts through ``interner``)."""
    try:
        wire = _decode_object(raw).metadata
    except msgspec.DecodeError as e:
        raise UndecodableObject(str(e)) from e
    try:
        # kcp's resourceVersions are etcd revisions of the shard, integers ordered across every
        # logical cluster of it: one virtual-workspace URL is one shard.
        rv = int(wire.resourceVersion)
    except ValueError as e:
        raise UndecodableObject(f"resourceVersion {wire.resourceVersion!r}") from e
    if interner is None:
        annotations = wire.annotations or _NO_LABELS
        labels = wire.labels or _NO_LABELS
        finalizers = tuple(wire.finalizers or ())
        namespace = wire.namespace
    else:
        annotations = interner.mapping(wire.annotations)
        labels = interner.mapping(wire.labels)
        finalizers = interner.strings(wire.finalizers)
        namespace = sys.intern(wire.namespace)
    return Meta(
        cluster=annotations.get(CLUSTER_ANNOTATION, ""),
        namespace=namespace,
        name=wire.name,
        resource_version=rv,
        labels=labels,
        annotations=annotations,
        finalizers=finalizers,
        deletion_timestamp=wire.deletionTimestamp,
    )


class Entry(msgspec.Struct, frozen=True, gc=False):
    """One stored object version: its original bytes and its decoded metadata."""

    raw: bytes
    meta: Meta

    @property
    def key(self) -> Key:
        return self.meta.key


def entry(raw: bytes | msgspec.Raw, *, interner: Interner | None = None) -> Entry:
    """An :class:`Entry` for one object's JSON (its bytes copied, see the module docstring)."""
    data = bytes(raw)
    return Entry(raw=data, meta=decode_meta(data, interner=interner))


@dataclass(slots=True)
class Change:
    """One change in the event window, at ``rv``.

    ``prev`` is the stored version before the change (None for a creation); ``new`` the version
    after it (None for a deletion, whose ``deleted`` holds the object as the upstream's DELETED
    event carried it: its last state, at the deletion's resourceVersion).
    """

    type: ChangeType
    rv: int
    prev: Entry | None
    new: Entry | None
    deleted: Entry | None = None
    lines: dict[str, bytes] = field(default_factory=dict)
    """Memo of encoded event lines shared by every client that sends this change the same way
    (key: the event type and representation), so a fan-out encodes each line once."""
    departed: Entry | None = field(default=None, repr=False, compare=False)
    """Memo of what a DELETED for this change carries to a client that saw the object leave
    (:func:`vwserver.cache.views.transition`), built on first use and shared by every client."""

    @property
    def key(self) -> Key:
        some = self.new or self.deleted or self.prev
        assert some is not None
        return some.key
