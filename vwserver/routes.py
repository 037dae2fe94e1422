"""The route table: which slices this server serves, and where each one's upstream is.

A :class:`RouteTable` is immutable. Whoever learns about slices (the static config today, the
embedded controller later) builds a whole new table and hands it to :meth:`Routes.replace`; a
request looks up its slice once, in whatever table is current when it arrives, and keeps that
:class:`Route` for its lifetime. Swapping one reference is atomic in asyncio, so no lock is needed
and a request never sees half an update.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from vwserver.selector import Selector


@dataclass(frozen=True, slots=True)
class Route:
    """One served slice."""

    cluster: str
    """Logical cluster of the slice object (the first path segment of its URL)."""
    name: str
    selector: Selector
    upstream_url: str
    """APIExport virtual-workspace base URL, ``https://shard/services/apiexport/<id>/<export>``."""
    not_ready: str | None = None
    """Why the slice cannot serve yet (answered as 503); None when it is ready."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.cluster, self.name)


class RouteTable:
    """An immutable mapping of ``(slice cluster, slice name)`` to :class:`Route`."""

    __slots__ = ("_routes",)

    def __init__(self, routes: Iterable[Route] = ()) -> None:
        self._routes: Mapping[tuple[str, str], Route] = {r.key: r for r in routes}

    def lookup(self, cluster: str, name: str) -> Route | None:
        return self._routes.get((cluster, name))

    def __iter__(self) -> Iterator[Route]:
        return iter(self._routes.values())

    def __len__(self) -> int:
        return len(self._routes)


class Routes:
    """Holds the current :class:`RouteTable`; replaced wholesale, never mutated."""

    __slots__ = ("_table",)

    def __init__(self, table: RouteTable | None = None) -> None:
        self._table = table or RouteTable()

    @property
    def table(self) -> RouteTable:
        return self._table

    def replace(self, table: RouteTable) -> None:
        self._table = table
