"""vwserver's upstream client, recording what it sends: the proof that a read asked kcp what it
should (e.g. that every LIST names the slice, :func:`tests.security.support.unselected_lists`),
against the fake and real kcp alike. The shared cache's own reads (its reflector) go through
the cache's own client and are not recorded here."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from multidict import CIMultiDict
from yarl import URL

from vwserver.proxy.connections import Fetched
from vwserver.proxy.upstream import UpstreamClient, UpstreamRequest


@dataclass(frozen=True)
class Sent:
    """One request the proxy sent upstream."""

    method: str
    path: str
    query: dict[str, str]


class RecordingUpstream(UpstreamClient):
    """An :class:`~vwserver.proxy.upstream.UpstreamClient` that keeps every request in
    :attr:`sent`."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.sent: list[Sent] = []

    def _record(self, method: str, url: str, query: list[tuple[str, str]]) -> None:
        self.sent.append(Sent(method, URL(url, encoded=True).path, dict(query)))

    def request(
        self, method: str, url: str, *, query: Iterable[tuple[str, str]] = (), **kw: Any
    ) -> UpstreamRequest:
        query = list(query)
        self._record(method, url, query)
        return super().request(method, url, query=query, **kw)

    async def fetch(
        self,
        url: str,
        *,
        query: Iterable[tuple[str, str]] = (),
        headers: CIMultiDict[str] | None = None,
        read_timeout: float | None = 60.0,
    ) -> Fetched:
        query = list(query)
        if self._tls_for(URL(url, encoded=True)) is not False:  # else it is sent by request()
            self._record("GET", url, query)
        return await super().fetch(url, query=query, headers=headers, read_timeout=read_timeout)

    def lists(self, resource: str) -> list[dict[str, str]]:
        """The queries of the LISTs of ``resource`` (its plural) sent so far (watches and GETs
        of one object left out)."""
        return [
            s.query
            for s in self.sent
            if s.method == "GET"
            and s.path.endswith(f"/{resource}")
            and s.query.get("watch") not in ("true", "1")
        ]
