"""The filtering proxy's entry point: from an HTTP request to the right guarded operation.

Order of decisions, each of which can end the request with a Status before anything is sent
upstream: path syntax (400) → header field syntax (400,
:mod:`~vwserver.proxy.request_headers`) → what the request is (verb/resource, 400/405) →
impersonation asked for (``Impersonate-*``, ``X-Remote-*``: 403, by the field names alone) → who
the caller is and whether it may use the slice with that verb (401/403, :mod:`vwserver.auth`;
before the lookup, so a caller learns nothing about slices it may not use) → slice exists (404)
→ slice ready (503) → allowed on this kind of target (wildcard: list/watch only, 405;
apibindings: read-only, 403) → the verb's own guard.

Every request, whatever ends it, is observed once when it ends: one log line on
:data:`~vwserver.logs.ACCESS_LOGGER` (slice, verb, user, code, duration, request id — never a
token, a query string or a body) and the request counters and latency histogram of
:class:`~vwserver.metrics.ServerMetrics`. A watch is observed when it ends; its latency is the
time until its response headers went out (:func:`record_headers_sent`), not its lifetime.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import secrets
from collections.abc import Awaitable, Callable

from aiohttp import web

from vwserver import metrics as m
from vwserver.auth.guard import AuthMode, Gate
from vwserver.cache.registry import CacheRegistry
from vwserver.cache.related_index import ReferenceIndexes, SliceReferences
from vwserver.errors import (
    BadGateway,
    Forbidden,
    MethodNotAllowed,
    NotFound,
    RequestEntityTooLarge,
    RequestError,
    UpstreamUnavailable,
    UpstreamUnreachable,
)
from vwserver.holds import Member, slice_id
from vwserver.k8s import kcp
from vwserver.k8s.status import from_error
from vwserver.logs import ACCESS_LOGGER, FIELDS_ATTR, REQUEST_ID
from vwserver.metrics import ServerMetrics
from vwserver.proxy import (
    cache_plan,
    cached,
    cached_claimed,
    cached_tables,
    lists,
    negotiation,
    options,
    reads,
    request_headers,
    watch,
    writes,
)
from vwserver.proxy.context import ProxyRequest, RequestRecord
from vwserver.proxy.paths import READ_VERBS, Verb, classify, split_slice_path
from vwserver.proxy.upstream import UpstreamClient
from vwserver.related import ClaimedView, Rule
from vwserver.routes import Route, Routes
from vwserver.selector import Selector

log = logging.getLogger(__name__)
access_log = logging.getLogger(ACCESS_LOGGER)

# nginx's code for "the client closed the connection before the response started"; only ever
# logged and counted, never sent.
CLIENT_CLOSED = 499

RECORD_KEY = web.RequestKey("vwserver_record", RequestRecord)

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
        metrics: ServerMetrics,
        closing: asyncio.Event,
        guard: Gate,
        mutating_admission: bool = False,
        cache: CacheRegistry | None = None,
        unrecorded_move: Callable[[], None] | None = None,
    ) -> None:
        """``cache``: the shared watch cache that serves LIST and WATCH where it can (None: every
        request goes to kcp); ``unrecorded_move``: told when a read finds an object leaving a
        slice whose move is not recorded yet (the handoff loop's wake-up)."""
        self._unrecorded_move = unrecorded_move
        self._routes = routes
        self._cache = cache
        self._upstream = upstream
        self._page_size = page_size
        self._mutating_admission = mutating_admission
        self._metrics = metrics
        self._closing = closing
        self._guard = guard
        # In delegated mode the upstream sees vwserver's identity, not the caller's.
        self._delegated = guard.mode is AuthMode.DELEGATED
        # referencedBy rules read their referencing objects from the shared cache
        self._references = ReferenceIndexes(cache) if cache is not None else None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        record = RequestRecord(id=_request_id(), started=asyncio.get_running_loop().time())
        request[RECORD_KEY] = record
        context = REQUEST_ID.set(record.id)
        code = 500  # an unexpected exception: aiohttp answers 500
        try:
            try:
                try:
                    response = await self._serve(request, record)
                except web.HTTPRequestEntityTooLarge as e:
                    # aiohttp's client_max_size, raised while reading the body: a Status too.
                    raise RequestEntityTooLarge("the request body is too large") from e
            except RequestError as e:
                if isinstance(e, UpstreamUnreachable):
                    self._metrics.upstream_errors.labels(m.UNREACHABLE).inc()
                elif isinstance(e, BadGateway):
                    self._metrics.upstream_errors.labels(m.BAD_GATEWAY).inc()
                response = error_response(e)
            else:
                # The proxy's own errors are raised, so a 5xx returned is the upstream's, relayed.
                if response.status >= 500:
                    self._metrics.upstream_errors.labels(m.UPSTREAM_5XX).inc()
                elif response.status in (401, 403) and self._delegated and not response.prepared:
                    response = _upstream_denial(record, response)
            code = response.status
            return response
        except asyncio.CancelledError:  # the client went away (handler_cancellation)
            code = CLIENT_CLOSED
            raise
        finally:
            if record.status is not None:  # headers went out: that is what the client got
                code = record.status
            self._observe(request, record, code)
            REQUEST_ID.reset(context)

    def _observe(self, request: web.Request, record: RequestRecord, code: int) -> None:
        end = asyncio.get_running_loop().time()
        # A watch's latency is the time to establish it (headers sent), not its lifetime.
        done = end
        if record.verb == Verb.WATCH and record.headers_sent is not None:
            done = record.headers_sent
        self._metrics.observe_request(
            slice_label=record.slice, verb=record.verb, code=code, seconds=done - record.started
        )
        if not access_log.isEnabledFor(logging.INFO):
            return
        duration_ms = round((end - record.started) * 1000, 2)
        path = request.raw_path.split("?", 1)[0]
        access_log.info(
            "%s %s %d %s slice=%s user=%s %.2fms",
            request.method,
            path,
            code,
            record.verb,
            record.slice,
            record.user or "-",
            duration_ms,
            extra={
                FIELDS_ATTR: {
                    "method": request.method,
                    "path": path,
                    "code": code,
                    "verb": record.verb,
                    "slice": record.slice,
                    "user": record.user,
                    "durationMs": duration_ms,
                }
            },
        )

    async def _serve(self, request: web.Request, record: RequestRecord) -> web.StreamResponse:
        path = split_slice_path(request.raw_path.split("?", 1)[0])
        if path is None:
            raise NotFound(f"the server could not find the requested resource {request.path!r}")
        # The slice label counts existing slices only (bounded cardinality), also for requests
        # the guard refuses; the metrics are the operator's, nothing here reaches the caller.
        if self._routes.table.lookup(path.slice_cluster, path.slice_name) is not None:
            record.slice = f"{path.slice_cluster}/{path.slice_name}"
        # Everything the request says is parsed against allow-lists before anyone is asked
        # anything: its header fields' syntax, its path and verb, its query, the
        # representation it wants.
        request_headers.check(request.headers.items())
        query = list(request.rel_url.query.items())
        api = classify(path.api_path, method=request.method, watch=options.watch_requested(query))
        record.verb = api.verb
        # Before the guard: the answer depends on the field names only (no oracle), and costs
        # no review.
        request_headers.refuse_impersonation(request.headers.keys())
        checked = options.check(query, verb=api.verb, discovery=api.discovery)
        accept = request.headers.get("Accept")
        representation = (
            negotiation.negotiate_discovery(accept)
            if api.discovery
            else negotiation.negotiate(accept, verb=api.verb)
        )
        upstream = self._upstream
        identity = await self._guard.authenticate(request, cluster=path.slice_cluster)
        record.user = identity.user  # logged also when the caller is then refused
        await self._guard.authorize(
            identity,
            slice_cluster=path.slice_cluster,
            slice_name=path.slice_name,
            verb=api.verb,
        )
        if (token := self._guard.upstream_token(request)) is not None:
            upstream = upstream.for_caller(token)
        route = self._routes.table.lookup(path.slice_cluster, path.slice_name)
        if route is None:
            raise NotFound(
                f'filteredapiexportendpointslice "{path.slice_name}" not found '
                f"in logical cluster {path.slice_cluster}"
            )
        record.slice = f"{route.cluster}/{route.name}"
        if route.not_ready is not None:
            raise UpstreamUnavailable(
                f"slice {route.cluster}/{route.name} is not ready: {route.not_ready}",
                retry_after=5,
            )
        upstream_base = route.upstream_for(path.shard)
        if upstream_base is None:
            raise NotFound(f"slice {route.cluster}/{route.name} has no shard {path.shard!r}")
        if path.wildcard and api.verb not in (Verb.LIST, Verb.WATCH) and not api.discovery:
            # kcp serves clusters/* for list and watch only; a GET there has no object to name.
            raise MethodNotAllowed(
                f"{api.verb} is not allowed on clusters/*; address one logical cluster"
            )
        claimed: ClaimedView | None = None
        references: SliceReferences | None = None
        claimed_cache = False
        if not api.discovery and (api.group, api.resource) in route.claimed:
            # A claimed resource: its rules alone decide, whatever the slice's objectSelector
            # says (nothing held). LIST and WATCH come from the shared cache where it can
            # answer; kcp is asked with what of the rules a label selector can say.
            claimed, references = await self._claimed(route, upstream_base, api.group, api.resource)
            claimed = dataclasses.replace(claimed, cluster=path.cluster)
            claimed_cache = route.cache and self._delegated
            pushed = pushdown(claimed.rules) if api.verb in (Verb.LIST, Verb.WATCH) else None
            route = dataclasses.replace(route, selector=pushed or Selector(), cache=False)
        ctx = ProxyRequest(
            request=request,
            route=route,
            path=path,
            api=api,
            options=checked,
            representation=representation,
            upstream=upstream,
            page_size=self._page_size,
            mutating_admission=self._mutating_admission,
            upstream_base=upstream_base,
            metrics=self._metrics,
            record=record,
            closing=self._closing,
            peers=self._routes.selector_of,
            unrecorded_move=self._unrecorded_move,
            # In passthrough mode kcp decides with the caller's own token what it may read; a
            # cache read with vwserver's identity could grant more, so such reads go to kcp —
            # whose label-selected answers cannot show an object leaving the slice: holds are
            # recorded only where the slice's reads come from the cache.
            records_holds=self._cache is not None and route.cache and self._delegated,
            cache=self._cache,
            claimed=claimed,
            references=references,
        )
        if api.discovery:
            return await reads.serve_passthrough(ctx)
        serve_cached = _serve_claimed_cached if claimed_cache else _serve_cached
        if (
            self._cache is not None
            and (claimed_cache or ctx.records_holds)
            and cache_plan.cacheable(api, checked, representation, wildcard=path.wildcard)
        ):
            try:
                response = await serve_cached(ctx, self._cache)
            except cached.Fallback as e:
                self._metrics.cache_reads.labels(api.verb, "fallback").inc()
                log.info("%s of %s from kcp: %s", api.verb, api.resource, e)
                if api.verb is Verb.LIST and not ctx.options.get("limit"):
                    # the proxy pages kcp's answer itself: as few pages as its bounds allow
                    ctx.page_size = lists.first_page_size(
                        e.objects, e.raw_bytes, floor=ctx.page_size
                    )
            except BaseException:
                # The cache answered — an error Status, or a watch its client ended (the
                # handler is cancelled): served all the same.
                self._metrics.cache_reads.labels(api.verb, "served").inc()
                raise
            else:
                self._metrics.cache_reads.labels(api.verb, "served").inc()
                return response
        if api.is_apibindings:
            if api.verb not in READ_VERBS:
                raise Forbidden(f"apibindings are read-only through this endpoint ({api.verb})")
            # No slice's objects: GET and WATCH check the scope only (ctx.membership).
            if api.verb is Verb.LIST:
                return await lists.serve_apibindings_list(ctx)
        if ctx.path.shard and api.verb in (Verb.LIST, Verb.WATCH):
            await _refuse_foreign_resource_version(ctx)
        return await _BY_VERB[api.verb](ctx)

    async def _claimed(
        self, route: Route, upstream_base: str, group: str, resource: str
    ) -> tuple[ClaimedView, SliceReferences | None]:
        """The membership of claimed resource (group, resource) through ``route``: its rules,
        and for ``referencedBy`` rules the slice's live reference index (read before the
        request is answered: 503 while it is not; without the shared cache there is none, and
        such a rule shows nothing — fail closed)."""
        rules = route.related.for_claim(group, resource)
        if not any(r.reference is not None for r in rules) or self._references is None:
            return ClaimedView((group, resource), rules), None
        member = Member(
            selector=route.selector,
            id=slice_id(route.cluster, route.name),
            peers=self._routes.selector_of,
        )
        references = self._references.get(
            route=route,
            retired=route.retired,
            upstream=upstream_base,
            rules=route.related,
            view=lambda: member,
        )
        if not await references.wait_synced(REFERENCES_SYNC_SECONDS):
            raise UpstreamUnavailable(
                f"slice {route.cluster}/{route.name}: the objects that reference "
                f"{resource} are not read yet",
                retry_after=5,
            )
        return ClaimedView((group, resource), rules, index=references.index), references


def pushdown(rules: tuple[Rule, ...]) -> Selector | None:
    """What kcp can be asked with for a claimed resource read from kcp: the rule's label
    selector when the resource has exactly one rule and it is a selector (kcp then sends
    only what that rule shows; the proxy checks every object against the rules all the same).
    A ``referencedBy`` rule, or several rules (an OR no label selector can say): None — kcp is
    asked for the client's own selection, and the proxy filters."""
    if len(rules) == 1 and rules[0].selector is not None:
        return rules[0].selector
    return None


async def _serve_claimed_cached(ctx: ProxyRequest, cache: CacheRegistry) -> web.StreamResponse:
    """A claimed resource's LIST or WATCH from the shared cache (:mod:`~vwserver.proxy.
    cached_claimed`), in the negotiated representation."""
    return await _from_cache(
        ctx,
        cache,
        table=ctx.representation.shape is negotiation.Shape.TABLE,
        serve_list=cached_claimed.serve_claimed_list,
        serve_watch=cached_claimed.serve_claimed_watch,
    )


REFERENCES_SYNC_SECONDS = 10.0
"""How long a request of a claimed resource waits for the slice's reference index."""


async def _refuse_foreign_resource_version(ctx: ProxyRequest) -> None:
    """On a shard's endpoint, a LIST or WATCH that kcp answers (not the cache, which checks
    for itself): 410 for a resourceVersion newer than the shard has (another shard's,
    :func:`cached.refuse_foreign_resource_version`) — one small upstream read per request
    that carries a resourceVersion. When that read fails, kcp answers the request."""
    rv = ctx.options.get("resourceVersion") or ""
    if not rv.isdigit() or rv == "0":
        return  # no revision (or not one): kcp answers, as for any other value
    with contextlib.suppress(cached.Fallback):
        await cached.refuse_foreign_resource_version(ctx, int(rv))


_ID_PREFIX = secrets.token_hex(6)
_ID_NUMBERS = itertools.count(1)


def _request_id() -> str:
    """A request's id in the log lines: this process's random prefix and a number — unique
    like a UUID, without a random draw and a UUID object per request."""
    return f"{_ID_PREFIX}-{next(_ID_NUMBERS):x}"


async def _serve_cached(ctx: ProxyRequest, cache: CacheRegistry) -> web.StreamResponse:
    if ctx.representation.shape is negotiation.Shape.TABLE:
        return await _from_cache(
            ctx,
            cache,
            table=True,
            serve_list=cached_tables.serve_table_list,
            serve_watch=cached_tables.serve_table_watch,
        )
    return await _from_cache(
        ctx,
        cache,
        table=False,
        serve_list=cached.serve_cached_list,
        serve_watch=cached.serve_cached_watch,
    )


async def _from_cache(
    ctx: ProxyRequest,
    cache: CacheRegistry,
    *,
    table: bool,
    serve_list: Callable[..., Awaitable[web.StreamResponse]],
    serve_watch: Callable[..., Awaitable[web.StreamResponse]],
) -> web.StreamResponse:
    """Hold the shared collection (as Tables: ``table``) of the request's resource while
    ``serve_list`` or ``serve_watch`` answers from it with the request's plan."""
    base, path = ctx.upstream_base, cached.api_path(ctx)
    resource = await (
        cache.acquire_table(upstream=base, api_path=path)
        if table
        else cache.acquire(upstream=base, api_path=path)
    )
    try:
        if ctx.api.verb is Verb.LIST:
            listing = cache_plan.list_plan(ctx.options, origin=kcp.shard_id(ctx.upstream_base))
            return await serve_list(ctx, resource, listing)
        return await serve_watch(ctx, resource, cache_plan.watch_plan(ctx.options))
    finally:
        cache.release(resource)


def _upstream_denial(record: RequestRecord, relayed: web.StreamResponse) -> web.Response:
    """kcp refused vwserver's own identity (its 401/403 names vwserver's account and its
    permissions): the caller gets a Status about its request instead, and the operator a log
    line. A 401 here is vwserver's credential, not the caller's: the caller cannot fix it."""
    log.warning(
        "upstream refused vwserver's identity with %d for %s on slice %s",
        relayed.status,
        record.verb,
        record.slice,
    )
    if relayed.status == 401:
        return error_response(
            UpstreamUnavailable(
                "the slice's upstream did not accept vwserver's credentials", retry_after=5
            )
        )
    return error_response(
        Forbidden(f"{record.verb} through slice {record.slice} was refused by its upstream")
    )


def error_response(error: RequestError) -> web.Response:
    headers = {}
    if error.retry_after is not None:
        headers["Retry-After"] = str(error.retry_after)
    return web.Response(
        status=error.code, body=from_error(error), content_type="application/json", headers=headers
    )


async def record_headers_sent(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare`` hook: note when (and with which status) a slice request's
    response headers went out — a watch's latency, and the code of a stream that is cut off."""
    record = request.get(RECORD_KEY)
    if record is not None:
        record.status = response.status
        record.headers_sent = asyncio.get_running_loop().time()
