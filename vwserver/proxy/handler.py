"""The filtering proxy's entry point: from an HTTP request to the right guarded operation.

Order of decisions, each of which can end the request with a Status before anything is sent
upstream: path syntax (400) → what the request is (verb/resource, 400/405) → who the caller is
and whether it may use the slice with that verb (401/403, :mod:`vwserver.auth`; before the
lookup, so a caller learns nothing about slices it may not use) → slice exists (404) → slice
ready (503) → allowed on this kind of target (wildcard: list/watch only, 405; apibindings:
read-only, 403) → the verb's own guard.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from vwserver.auth.guard import Guard
from vwserver.errors import Forbidden, MethodNotAllowed, NotFound, RequestError, UpstreamUnavailable
from vwserver.k8s.status import from_error
from vwserver.proxy import lists, reads, watch, writes
from vwserver.proxy.context import ProxyRequest
from vwserver.proxy.paths import READ_VERBS, Verb, classify, split_slice_path
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Routes

log = logging.getLogger(__name__)

_Serve = Callable[[ProxyRequest], Awaitable[web.StreamResponse]]

_BY_VERB: dict[Verb, _Serve] = {
    Verb.GET: reads.serve_get,
    Verb.LIST: lists.serve_list,
    Verb.WATCH: watch.serve_watch,
    Verb.CREATE: writes.serve_create,
    Verb.UPDATE: writes.serve_update,
    Verb.PATCH: writes.serve_patch,
    Verb.DELETE: writes.serve_delete,
    Verb.DELETECOLLECTION: writes.serve_deletecollection,
}


class ProxyHandler:
    """Serves ``/services/filtered-apiexport/...`` for every slice in ``routes``."""

    def __init__(
        self,
        *,
        routes: Routes,
        upstream: UpstreamClient,
        page_size: int,
        guard: Guard | None = None,
    ) -> None:
        self._routes = routes
        self._upstream = upstream
        self._page_size = page_size
        self._guard = guard

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._serve(request)
        except RequestError as e:
            return error_response(e)

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        path = split_slice_path(request.raw_path.split("?", 1)[0])
        if path is None:
            raise NotFound(f"the server could not find the requested resource {request.path!r}")
        watch_param = request.query.get("watch", "").lower() in ("1", "true")
        api = classify(path.api_path, method=request.method, watch=watch_param)
        upstream = self._upstream
        if self._guard is not None:
            await self._guard.admit(
                request, slice_cluster=path.slice_cluster, slice_name=path.slice_name, verb=api.verb
            )
            if (token := self._guard.upstream_token(request)) is not None:
                upstream = upstream.for_caller(token)
        route = self._routes.table.lookup(path.slice_cluster, path.slice_name)
        if route is None:
            raise NotFound(
                f'filteredapiexportendpointslice "{path.slice_name}" not found '
                f"in logical cluster {path.slice_cluster}"
            )
        if route.not_ready is not None:
            raise UpstreamUnavailable(
                f"slice {route.cluster}/{route.name} is not ready: {route.not_ready}",
                retry_after=5,
            )
        upstream_base = route.upstream_for(path.shard)
        if upstream_base is None:
            raise NotFound(f"slice {route.cluster}/{route.name} has no shard {path.shard!r}")
        if path.wildcard and api.verb not in (Verb.LIST, Verb.WATCH) and not api.discovery:
            # kcp serves clusters/* for list and watch only (FIELD-NOTES).
            raise MethodNotAllowed(
                f"{api.verb} is not allowed on clusters/*; address one logical cluster"
            )
        ctx = ProxyRequest(
            request=request,
            route=route,
            path=path,
            api=api,
            upstream=upstream,
            page_size=self._page_size,
            upstream_base=upstream_base,
        )
        if api.discovery:
            return await reads.serve_passthrough(ctx)
        if api.is_apibindings:
            if api.verb not in READ_VERBS:
                raise Forbidden(f"apibindings are read-only through this endpoint ({api.verb})")
            return await reads.serve_passthrough(ctx)
        return await _BY_VERB[api.verb](ctx)


def error_response(error: RequestError) -> web.Response:
    headers = {}
    if error.retry_after is not None:
        headers["Retry-After"] = str(error.retry_after)
    return web.Response(
        status=error.code, body=from_error(error), content_type="application/json", headers=headers
    )
