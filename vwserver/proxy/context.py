"""Per-request state shared by the list, watch, read and write paths of the proxy."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from aiohttp import web
from multidict import MultiDictProxy

from vwserver.errors import BadRequest, SelectorError
from vwserver.k8s.status import not_found
from vwserver.metrics import UNKNOWN, ServerMetrics
from vwserver.proxy.paths import ApiRequest, SlicePath
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Route
from vwserver.selector import Selector


@dataclass(slots=True)
class RequestRecord:
    """What the request's log line and metrics say about it; filled in as the request proceeds."""

    id: str
    started: float
    """``loop.time()`` when the handler started."""
    slice: str = UNKNOWN
    """``<cluster>/<name>`` once the slice is known to exist, else :data:`UNKNOWN`."""
    verb: str = UNKNOWN
    user: str | None = None
    """The authenticated user's name (never a credential); None before or without auth."""
    status: int | None = None
    """The status of the response whose headers went out (streamed responses), else None."""
    headers_sent: float | None = None
    """``loop.time()`` when the response headers went out (a watch is established)."""


@dataclass(slots=True)
class ProxyRequest:
    request: web.Request
    route: Route
    path: SlicePath
    api: ApiRequest
    upstream: UpstreamClient
    page_size: int
    upstream_base: str
    """The upstream APIExport virtual-workspace URL this request goes to (its shard's)."""
    metrics: ServerMetrics
    record: RequestRecord
    closing: asyncio.Event
    """Set when the server stops serving (graceful shutdown): open watches end cleanly."""

    @property
    def query(self) -> MultiDictProxy[str]:
        return self.request.rel_url.query

    @property
    def upstream_url(self) -> str:
        """Same path below the upstream virtual workspace as below the slice."""
        return f"{self.upstream_base}/clusters/{self.path.cluster}{self.path.api_path}"

    @property
    def object_url(self) -> str:
        """URL of the named object itself (without subresource), for the proxy's own checks."""
        api = self.api
        base = f"{self.upstream_base}/clusters/{self.path.cluster}"
        prefix = f"/apis/{api.group}/{api.version}" if api.group else f"/api/{api.version}"
        ns = f"/namespaces/{api.namespace}" if api.namespace else ""
        return f"{base}{prefix}{ns}/{api.resource}/{api.name}"

    def effective_selector(self) -> Selector:
        """The slice's selector AND the client's ``labelSelector`` (400 if that is malformed)."""
        client = self.query.getall("labelSelector", [])
        selector = self.route.selector
        for text in client:
            try:
                selector = selector & Selector.parse(text)
            except SelectorError as e:
                raise BadRequest(e.message) from e  # the message names labelSelector
        return selector

    def upstream_query(
        self, *, drop: Iterable[str] = (), extra: Iterable[tuple[str, str]] = ()
    ) -> list[tuple[str, str]]:
        """The client's query with its labelSelector replaced by the effective selector."""
        dropped = {"labelSelector", *drop}
        out = [(k, v) for k, v in self.query.items() if k not in dropped]
        if self.api.name == "" or self.api.verb in ("list", "watch", "deletecollection"):
            rendered = self.effective_selector().render()
            if rendered:
                out.append(("labelSelector", rendered))
        out.extend(extra)
        return out

    def not_found(self) -> web.Response:
        """The apiserver's NotFound for this object, for missing and invisible objects alike."""
        return web.Response(
            status=404,
            body=not_found(resource=self.api.resource, group=self.api.group, name=self.api.name),
            content_type="application/json",
        )
