"""A shared resource of Table rows: the second representation of one upstream collection.

:class:`SharedTable` is a :class:`~vwserver.cache.shared.SharedResource` whose reflector runs in
table mode (``Accept: ...;as=Table``, ``includeObject=Object``): its store holds one
:class:`~vwserver.cache.tables.Row` per object — the same key, bytes and decoded metadata as the
object cache holds, plus kcp's cells — so every view, selector, window and subscription of the
object cache works on it unchanged. Why a second upstream watch and not cells computed in
process: :mod:`vwserver.cache.tables`.

What it costs: one more upstream LIST+WATCH per resource while someone reads Tables (stopped
when idle, like any shared resource), and per object a row — its cells and a small struct, the
object's bytes and metadata shared with the object cache's entry when that holds the same
version (looked up when the row arrives: ``sibling``), else a copy of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import msgspec

from vwserver.cache.entries import Entry
from vwserver.cache.shared import SharedResource
from vwserver.cache.tables import NO_COLUMNS, Columns, Row, date_sources, parse_columns
from vwserver.clock import Clock
from vwserver.k8s.types import ObjectHead

__all__ = ["SharedTable"]


class _RowWire(msgspec.Struct):
    cells: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"[]"))
    object: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))


_decode_row = msgspec.json.Decoder(_RowWire).decode
_decode_head = msgspec.json.Decoder(ObjectHead).decode


class SharedTable(SharedResource):
    """The collection ``api_path`` of ``upstream`` as Table rows (see the module docstring).
    ``sibling``: the object cache of the same collection, if one runs (rows share its
    entries)."""

    def __init__(
        self,
        *,
        clock: Clock,
        sibling: Callable[[], SharedResource | None] = lambda: None,
        **options: Any,
    ) -> None:
        """``options``: :class:`SharedResource`'s (the reflector always in table mode)."""
        super().__init__(clock=clock, **options, table=True)
        # Its own name in logs, /debug/cache and the metrics' resource label: the object
        # cache of the same collection has the plain URL.
        self.url = f"{self.url} (as Table)"
        self.columns: Columns = NO_COLUMNS
        """The column definitions of the rows in the store (replaced by every list)."""
        self._clock = clock
        self._sibling = sibling
        self._listing: Columns = NO_COLUMNS
        """The columns the rows being decoded were printed with (the reflector's)."""
        self._kind = ""
        # /apis/<group>/<version>/<resource> or /api/<version>/<resource>
        parts = self.api_path.strip("/").split("/")
        self._api_version = "/".join(parts[1:3]) if parts[0] == "apis" else parts[1]

    def now(self) -> datetime:
        """The time ``date`` cells are printed at."""
        return self._clock.now()

    @property
    def kind(self) -> str:
        """The objects' ``kind``, from the first row seen (empty before)."""
        return self._kind

    @property
    def api_version(self) -> str:
        """The objects' ``apiVersion`` (from the collection's path)."""
        return self._api_version

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "representation": "Table"}

    def on_list(self, items: list[Entry], resource_version: str) -> None:
        # The rows listed were printed with the listing's columns; from now on they are served.
        self.columns = self._listing
        super().on_list(items, resource_version)

    def _decode(self, raw: msgspec.Raw) -> Row:
        wire = _decode_row(raw)
        item = super()._decode(wire.object)
        sibling = self._sibling()
        if sibling is not None:
            same = sibling.store.get(item.key)
            if (
                same is not None
                and same.meta.resource_version == item.meta.resource_version
                and same.raw == item.raw
            ):
                item = same
        if not self._kind:
            self._kind = _decode_head(item.raw).kind
        columns = self._reflector.columns
        if columns != self._listing.raw:
            self._listing = parse_columns(columns)
        return Row(
            raw=item.raw,
            meta=item.meta,
            cells=bytes(wire.cells),
            dates=date_sources(self._listing, item.raw),
        )
