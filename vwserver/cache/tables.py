"""Table rows in the shared watch cache, and how they are printed — pure, no I/O.

``kubectl get`` asks for ``meta.k8s.io`` Tables: per object a row of *cells* (the schema's
printer columns) and the object itself, as ``includeObject=None|Metadata|Object`` says. The
cells are the server's: kcp's APIExport virtual workspace prints a resource with the printer
columns of its APIResourceSchema (``tableconvertor.New(additionalPrinterColumns)``: ``Name``,
then one column per printer column, each evaluated with a JSONPath; no defaulted ``Age`` column
when the schema declares none). vwserver cannot read the APIResourceSchema with its identity
(``apiexports/content`` only), and reproducing kcp's JSONPath printer (filters, Go's value
formatting) would be a second implementation that drifts. So the cache keeps kcp's cells: a
second shared list+watch of the collection *as Tables* with ``includeObject=Object`` (the
reflector's table mode) stores per object a :class:`Row` — the object's bytes and decoded
metadata, exactly as the object cache has them (membership is decided on the same
:class:`~vwserver.cache.entries.Meta` by the same :func:`~vwserver.cache.views.visible`), plus
kcp's cells.

**Time.** One kind of cell depends on *when* it is printed: a ``date`` column is the age of a
timestamp (``metatable.ConvertToHumanReadableDateType``: "5m", "3d4h"), relative to now. A
stored row must never show the age it had when kcp printed it, so every ``date`` cell is
printed again at response time from its source value, kept in the row (:attr:`Row.dates`). The
source is known where kcp's column definition names it: kcp describes a printer column that has
no description of its own as ``Custom resource definition column (in JSONPath format):
<path>`` — e.g. kubebuilder's ``Age`` column (``.metadata.creationTimestamp``). A ``date``
column with a description of its own, or with a path that is not a plain ``.a.b.c``, has no
known source: :attr:`Columns.unknown` says so, and such Tables stay with kcp (the proxy's
fallback). Every other cell depends on the object alone and is served as kcp printed it.

**Memory.** A row costs its cells (tens of bytes) and a small struct. Its object bytes and
metadata are shared with the object cache's entry when that holds the same version (the shared
resource looks it up when a row arrives); otherwise the row holds its own copy — a Table-only
resource costs what the object cache costs, plus the cells.

Printing follows kube-apiserver's ``asTable`` and the watch encoder: column definitions in a
list and in the first event of a watch only (``null`` after); a row's object is the object
(``Object``), a ``PartialObjectMetadata`` of the Table's group version without kcp's
original-apiVersion annotation (``Metadata``, the default) or ``null`` (``None``); a BOOKMARK
is a Table too, with one row printed from the bookmark object (empty name, no other values)
whose object is a ``PartialObjectMetadata`` unless ``includeObject=Object`` — also with
``None`` when it carries the initial-events-end annotation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import msgspec

from vwserver.cache.entries import Entry

__all__ = [
    "INCLUDE_METADATA",
    "INCLUDE_NONE",
    "INCLUDE_OBJECT",
    "NO_COLUMNS",
    "Columns",
    "Row",
    "TablePrinter",
    "date_cell",
    "date_sources",
    "human_duration",
    "parse_columns",
    "print_cells",
]

INCLUDE_NONE: Final = "None"
INCLUDE_METADATA: Final = "Metadata"
INCLUDE_OBJECT: Final = "Object"

CRD_COLUMN: Final = "Custom resource definition column (in JSONPath format): "
"""How the table convertor describes a printer column without a description of its own."""
_SIMPLE_PATH: Final = re.compile(r"^(\.[A-Za-z0-9_-]+)+$")
_INITIAL_EVENTS_END: Final = "k8s.io/initial-events-end"
_NULL: Final = b"null"
_encode = msgspec.json.Encoder().encode


class Row(Entry, frozen=True, gc=False):
    """One object as a Table row: the object's bytes and metadata (:class:`Entry`), the cells
    kcp printed for it, and the source values of its ``date`` cells (one per
    :attr:`Columns.dates`; None where the object has no string there)."""

    cells: bytes
    dates: tuple[str | None, ...] = ()


class _Column(msgspec.Struct):
    name: str = ""
    type: str = ""
    description: str = ""


_decode_columns = msgspec.json.Decoder(list[_Column]).decode


@dataclass(frozen=True, slots=True)
class Columns:
    """A Table's column definitions: as kcp sent them, and what printing needs of them."""

    raw: bytes
    """kcp's ``columnDefinitions`` JSON (printed as is)."""
    count: int
    dates: tuple[tuple[int, tuple[str, ...]], ...] = ()
    """The ``date`` columns: (cell index, JSONPath as field names)."""
    unknown: str | None = None
    """Why rows cannot be printed exactly now (a ``date`` column whose source is not known);
    None when they can."""


NO_COLUMNS: Final = Columns(raw=b"[]", count=0, unknown="no Table listed yet")


def parse_columns(raw: bytes) -> Columns:
    """The :class:`Columns` of kcp's ``columnDefinitions``."""
    try:
        columns = _decode_columns(raw)
    except msgspec.DecodeError:
        return Columns(raw=raw, count=0, unknown="undecodable column definitions")
    dates: list[tuple[int, tuple[str, ...]]] = []
    unknown: str | None = None
    for index, column in enumerate(columns):
        if column.type != "date":
            continue
        path = column.description.removeprefix(CRD_COLUMN)
        if path == column.description or not _SIMPLE_PATH.match(path):
            unknown = f"the source of date column {column.name!r} is not known"
            continue
        dates.append((index, tuple(path[1:].split("."))))
    return Columns(raw=raw, count=len(columns), dates=tuple(dates), unknown=unknown)


def date_sources(columns: Columns, obj: bytes) -> tuple[str | None, ...]:
    """The source value of every ``date`` column in the object ``obj`` (JSON): the string at
    its path, None where there is none (a missing key, a non-object on the way, another type
    — each prints as a ``null`` cell, as the table convertor's lookup with missing keys
    allowed does)."""
    if not columns.dates:
        return ()
    doc: Any = msgspec.json.decode(obj)
    values: list[str | None] = []
    for _, path in columns.dates:
        value = doc
        for name in path:
            value = value.get(name) if isinstance(value, dict) else None
        values.append(value if isinstance(value, str) else None)
    return tuple(values)


_RFC3339: Final = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(Z|[+-]\d{2}:\d{2})$"
)


def _parse_time(text: str) -> datetime | None:
    """``metav1.Time.UnmarshalQueryParameter``: None for the zero time (``""``, ``"null"``);
    ValueError when ``text`` is no RFC 3339 time."""
    if text in ("", "null"):
        return None
    match = _RFC3339.match(text)
    if match is None:
        raise ValueError(text)
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    offset = timedelta(0)
    if zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        hours, minutes = int(zone[1:3]), int(zone[4:6])
        if hours > 23 or minutes > 59:
            raise ValueError(text)
        offset = sign * timedelta(hours=hours, minutes=minutes)
    micros = int((fraction or "0")[:6].ljust(6, "0"))
    moment = datetime(
        int(year), int(month), int(day), int(hour), int(minute), int(second), micros, tzinfo=UTC
    )
    return moment - offset


def human_duration(elapsed: timedelta) -> str:
    """``duration.HumanDuration``: about two significant figures of ``elapsed``."""
    seconds = int(elapsed.total_seconds())  # Go's int(d.Seconds()) truncates towards zero
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        rest = seconds % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d{rest}h" if rest else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def date_cell(value: str | None, now: datetime) -> str | None:
    """A ``date`` cell at ``now`` (``cellForJSONValue``): None (``null``) without a string
    value, ``<invalid>`` for one that is no RFC 3339 time, ``<unknown>`` for the zero time."""
    if value is None:
        return None
    try:
        moment = _parse_time(value)
    except ValueError:
        return "<invalid>"
    if moment is None:
        return "<unknown>"
    return human_duration(now - moment)


_decode_cells = msgspec.json.Decoder(list[msgspec.Raw]).decode


def print_cells(
    row: Row, columns: Columns, now: datetime, *, dates: tuple[str | None, ...] | None = None
) -> bytes:
    """The row's cells at ``now``: kcp's, with every ``date`` cell printed anew (from
    ``dates``, default the row's own sources)."""
    dates = row.dates if dates is None else dates
    if not columns.dates or len(dates) != len(columns.dates):
        return row.cells
    cells: list[bytes | msgspec.Raw] = list(_decode_cells(row.cells))
    for (index, _), value in zip(columns.dates, dates, strict=True):
        if index < len(cells):
            cells[index] = _encode(date_cell(value, now))
    return b"[" + b",".join(cells) + b"]"


class _MetadataOnly(msgspec.Struct):
    metadata: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"{}"))


_decode_metadata = msgspec.json.Decoder(_MetadataOnly).decode


@dataclass(frozen=True, slots=True)
class TablePrinter:
    """Prints rows, watch events and bookmarks of one Table request."""

    version: str
    """The ``meta.k8s.io`` version asked for: ``v1`` or ``v1beta1``."""
    include: str
    """``includeObject``: :data:`INCLUDE_NONE`, :data:`INCLUDE_METADATA` or
    :data:`INCLUDE_OBJECT`."""
    columns: Columns
    object_api_version: str
    """The objects' ``apiVersion`` and ``kind`` (a BOOKMARK's object with ``Object``)."""
    object_kind: str

    @property
    def api_version(self) -> str:
        return f"meta.k8s.io/{self.version}"

    def row(self, row: Row, shown: bytes, now: datetime) -> bytes:
        """One row: its cells at ``now`` and ``shown`` (the object's bytes as the slice shows
        it) as ``includeObject`` asks. The date cells follow ``shown`` where it is not the
        stored object (an object leaving the slice shows a deletionTimestamp; a DELETED
        carries the change's resourceVersion); the other cells are kcp's."""
        dates = None
        if shown is not row.raw and self.columns.dates:
            dates = date_sources(self.columns, shown)
        cells = print_cells(row, self.columns, now, dates=dates)
        if self.include == INCLUDE_OBJECT:
            obj = shown
        elif self.include == INCLUDE_NONE:
            obj = _NULL
        else:
            obj = self._partial(bytes(_decode_metadata(shown).metadata))
        return b'{"cells":' + cells + b',"object":' + obj + b"}"

    def event(self, kind: str, row_bytes: bytes, rv: int, *, headers: bool) -> bytes:
        """A watch event (one JSON line) whose Table holds one printed row; the column
        definitions only with ``headers`` (a watch's first event)."""
        columns = self.columns.raw if headers else _NULL
        return (
            b'{"type":"'
            + kind.encode()
            + b'","object":{"kind":"Table","apiVersion":"'
            + self.api_version.encode()
            + b'","metadata":{"resourceVersion":"'
            + str(rv).encode()
            + b'"},"columnDefinitions":'
            + columns
            + b',"rows":['
            + row_bytes
            + b"]}}\n"
        )

    def bookmark(self, rv: int, *, initial_events_end: bool, headers: bool) -> bytes:
        """A BOOKMARK: a Table whose one row is printed from the bookmark object (an object
        with only its resourceVersion, and the initial-events-end annotation)."""
        cells = b'[""' + b",null" * max(self.columns.count - 1, 0) + b"]"
        annotations = {_INITIAL_EVENTS_END: "true"} if initial_events_end else None
        if self.include == INCLUDE_OBJECT:
            meta: dict[str, object] = {"resourceVersion": str(rv)}
            if annotations:
                meta = {"annotations": annotations, **meta}  # an object's keys come sorted
            obj = _encode(
                {"apiVersion": self.object_api_version, "kind": self.object_kind, "metadata": meta}
            )
        elif self.include == INCLUDE_NONE and not initial_events_end:
            obj = _NULL
        else:
            meta = {"resourceVersion": str(rv)}
            if annotations:
                meta["annotations"] = annotations  # ObjectMeta's field order
            obj = self._partial(_encode(meta))
        row = b'{"cells":' + cells + b',"object":' + obj + b"}"
        return self.event("BOOKMARK", row, rv, headers=headers)

    def _partial(self, metadata: bytes) -> bytes:
        return (
            b'{"kind":"PartialObjectMetadata","apiVersion":"'
            + self.api_version.encode()
            + b'","metadata":'
            + metadata
            + b"}"
        )
