"""The route table: which slices this server serves, and where each one's upstream is.

A :class:`RouteTable` is immutable. Whoever learns about slices (the static config, the embedded
controller) builds a whole new table and hands it to :meth:`Routes.replace`; a request looks up
its slice once, in whatever table is current when it arrives, and keeps that :class:`Route` for
its lifetime. Swapping one reference is atomic in asyncio, so no lock is needed and a request
never sees half an update.

A route that disappears or changes in a replacement is *retired*: its ``retired`` event is set,
and long-running requests on it (watches) end, so that a deleted slice stops serving at once, a
ready slice that becomes not ready (e.g. its export's owner revoked the grant) ends its watches
and answers 503 from then on, and a moved upstream is picked up by the clients' next request
.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from vwserver.holds import DEFAULT_HOLD_TIMEOUT_SECONDS
from vwserver.related import RelatedRules
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
    cache: bool = True
    """LIST and WATCH may be served from the shared watch cache (if the server runs one)."""
    shards: Mapping[str, str] = field(default_factory=dict)
    """Upstream URL per shard id, when the export has several shard endpoints."""
    hold_timeout: float = DEFAULT_HOLD_TIMEOUT_SECONDS
    """Seconds the slice may hold an object that is leaving it before vwserver removes the
    slice's finalizers (unless the slice released them or the operator ended the hold)."""
    claimed: frozenset[tuple[str, str]] = frozenset()
    """(group, resource) of the export's permission claims: requests for them are decided by
    :attr:`related` alone (no rule for one: none of its objects is visible)."""
    related: RelatedRules = field(default_factory=RelatedRules)
    """Which objects of the export's permission claims the slice shows
    (``spec.relatedResources``, :mod:`vwserver.related`)."""
    retired: asyncio.Event = field(default_factory=asyncio.Event, compare=False, repr=False)
    """Set when this route is removed or replaced; open watches on it end."""

    def upstream_for(self, shard: str) -> str | None:
        """The upstream base URL for a request (``shard`` empty: the default endpoint)."""
        if not shard:
            return self.upstream_url
        return self.shards.get(shard)

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

    def serves_cluster(self, cluster: str) -> bool:
        """Whether a ready slice of logical cluster ``cluster`` is served (a linear scan: for
        the rare paths that need it, not per request)."""
        return any(r.cluster == cluster and r.not_ready is None for r in self._routes.values())

    def upstreams(self) -> set[str]:
        """Every upstream URL (without a trailing ``/``) some route serves from, any shard's."""
        urls: set[str] = set()
        for route in self._routes.values():
            urls.update(u.rstrip("/") for u in (route.upstream_url, *route.shards.values()) if u)
        return urls

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

    def selector_of(self, sid: str) -> Selector | None:
        """The selector of the slice ``<cluster>/<name>`` in the current table, if served."""
        cluster, _, name = sid.partition("/")
        route = self._table.lookup(cluster, name)
        return route.selector if route is not None else None

    def replace(self, table: RouteTable) -> None:
        """Make ``table`` current; retire every route that is gone or changed.

        Unchanged routes keep their identity (the old object stays in the new table), so that
        requests already holding them are not retired by an unrelated update.
        """
        kept: list[Route] = []
        for new in table:
            old = self._table.lookup(new.cluster, new.name)
            kept.append(old if old is not None and old == new else new)
        current = RouteTable(kept)
        for old in self._table:
            if current.lookup(old.cluster, old.name) is not old:
                old.retired.set()
        self._table = current
