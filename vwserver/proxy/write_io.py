"""The executor of a guarded write (:mod:`vwserver.proxy.write_plan`): the I/O around a plan.

1. The stored object: from the shared watch cache when the slice reads from it and the
   resource's cache runs and has synced (:meth:`~vwserver.cache.registry.CacheRegistry.running`
   — a write never starts a watch of its own), else a GET. The cache is trusted only to make a
   write happen sooner, never to refuse one: an object the cache does not have, or has outside
   the slice, is read from kcp (a cache miss is not "missing" until kcp says so), and a plan
   that refuses a write, or finds the object leaving the slice, from the cache's copy is asked
   again with kcp's. So "missing" and "outside the slice" are always kcp's answer, the same
   NotFound both (no existence oracle), whether or not the cache had the object.
2. The plan's one write, conditional on the resourceVersion it checked.
3. When that precondition was the proxy's alone and fails — 409 Conflict; for a JSON patch its
   ``test`` operation, which kcp answers 422, and for an apply (of ``status``) whose 409 may
   also be a field manager's conflict, kcp is read and the resourceVersion compared —
   the object changed since it was read, or the cache was behind: the write is planned again
   from a fresh GET, at most :data:`ATTEMPTS` times, then the apiserver's 409. A client's own
   precondition that fails (409) gets kcp's 409 — once kcp's read shows the object still in
   the slice: one that left it, or is gone, is answered as missing (a conflict would tell that
   it exists). An object deleted in between answers the write 404: kcp is read again, and a
   missing object gets the proxy's NotFound (the same as for one that never was); one that is
   still there, unchanged, gets kcp's 404 (a subresource kcp does not serve).

Upstream requests per write: one when the cache has the object (update, status write, delete;
a merge or JSON patch the proxy applies itself; an apply whose result needs no dry run,
:func:`vwserver.proxy.write_plan.apply_result_decided`), two when it does not (a GET first), one
GET and one write more per lost race. Every write's answer is recorded in the cache
(:func:`wrote`), so that a client's next write of the object is not checked against the older
version the cache's stream may still show.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Final

import msgspec
from aiohttp import web
from multidict import CIMultiDict

from vwserver.errors import RequestError
from vwserver.holds import as_leaving
from vwserver.proxy.cached import api_path
from vwserver.proxy.context import ProxyRequest
from vwserver.proxy.filtering import UndecodableError, decode_head
from vwserver.proxy.holding import Stored
from vwserver.proxy.responses import read_body, relay_whole
from vwserver.proxy.write_plan import (
    Decision,
    Leaving,
    Send,
    kept_changing,
)

# How often a write is planned from a fresh read of kcp when the object changed in between.
ATTEMPTS: Final = 3
JSON: Final = "application/json"
JSON_PATCH: Final = "application/json-patch+json"
APPLY_PATCH: Final = "application/apply-patch+yaml"

_encode: Final = msgspec.json.Encoder().encode
log = logging.getLogger(__name__)

Plan = Callable[[Stored | None], Decision]


def wrote(ctx: ProxyRequest, answer: bytes) -> None:
    """Tell the shared cache the version kcp answered a write with (an object of the
    request's scope, :meth:`ProxyRequest.check_answer` checked): the next write to the object
    is checked against it, not against the older version the stream may still show."""
    registry = ctx.cache
    if registry is None or not ctx.records_holds:
        return
    resource = registry.running(upstream=ctx.upstream_base, api_path=api_path(ctx))
    if resource is None:
        return
    try:
        head = decode_head(answer)
    except UndecodableError:
        return
    if head.kind != resource.kind or not head.metadata.resourceVersion:
        return  # a Status (a deletion carried out), or not the object
    resource.wrote(answer)


def from_cache(ctx: ProxyRequest) -> Stored | None:
    """The stored object as the shared cache has it, if the slice reads from the cache, the
    resource's cache runs and has synced, and the object is in the request's scope and in the
    slice; None otherwise (then kcp is asked)."""
    registry = ctx.cache
    if registry is None or not ctx.records_holds:
        return None
    resource = registry.running(upstream=ctx.upstream_base, api_path=api_path(ctx))
    if resource is None:
        return None
    # The newest version the proxy knows: the store's, or its own last write's answer that the
    # stream has not delivered yet (SharedResource.wrote).
    found = resource.latest((ctx.path.cluster, ctx.api.namespace, ctx.api.name))
    if found is None:
        return None
    head = decode_head(found.raw)
    if not ctx.scope.admits(head.metadata) or not ctx.sees(head.metadata):
        return None
    return Stored(head=head, body=found.raw)


async def from_kcp(ctx: ProxyRequest) -> Stored | web.StreamResponse | None:
    """The stored object if it exists and is in the slice; None if it does not exist;
    the NotFound response if it exists outside the slice — or kcp answered with an object
    outside the request's scope (another cluster's, namespace's or name's: counted; nothing is
    written, not even an apply's create); an upstream error response as is.

    Callers answer "missing" with the same NotFound, except server-side apply, for which a
    missing object is a create.
    """
    async with ctx.upstream.request(
        "GET", ctx.object_url, headers=CIMultiDict({"Accept": JSON})
    ) as up:
        if up.status == 404:
            return None
        if up.status != 200:
            return await relay_whole(up)
        body = await read_body(up)
    head = decode_head(body)
    if not ctx.scope.admits(head.metadata):
        ctx.out_of_scope()
        return ctx.not_found()
    if not ctx.sees(head.metadata):
        return ctx.not_found()
    return Stored(head=head, body=body)


def check_admitted(ctx: ProxyRequest, answer: bytes) -> None:
    """The object kcp stored (its answer) is what the plan checked, unless kcp's mutating
    admission changed it after the check: webhooks and MutatingAdmissionPolicies of the
    APIExport's (the provider's) workspace run on every write through the virtual workspace
    (:data:`vwserver.proxy.patches.ADMISSION`), for updates as for patches. The write is done;
    an answer the slice no longer sees is logged (without its content) for the operator, whose
    policy moved the object."""
    try:
        meta = decode_head(answer).metadata
    except UndecodableError:
        return  # check_answer refused anything that is no object
    if ctx.sees(meta) and not ctx.route.selector.violations(meta.labels):
        return
    ctx.metrics.moved_by_admission.labels(
        f"{ctx.route.cluster}/{ctx.route.name}", ctx.api.verb
    ).inc()
    log.warning(
        "kcp's admission moved %s %s/%s out of slice %s/%s after vwserver checked the %s "
        "(a mutating webhook or policy of the provider's workspace changed its labels or holds)",
        ctx.api.resource,
        ctx.api.namespace,
        ctx.api.name,
        ctx.route.cluster,
        ctx.route.name,
        ctx.api.verb,
    )


async def _read(ctx: ProxyRequest) -> Stored | web.StreamResponse | None:
    """:func:`from_kcp` for a plan: an object outside the slice (or the request's scope) is
    given to it as missing, so that it answers both alike."""
    read = await from_kcp(ctx)
    if isinstance(read, web.StreamResponse) and read.status == 404:
        return None  # the proxy's NotFound (kcp's own 404 is None already)
    return read


async def execute(
    ctx: ProxyRequest,
    method: str,
    plan: Plan,
    *,
    leaving: Callable[[Stored, str], Awaitable[web.StreamResponse]],
    content_type: str = JSON,
    query: list[tuple[str, str]] | None = None,
    dry_run: bool = False,
) -> web.StreamResponse:
    """Carry out the write ``plan`` decides (see the module docstring). ``leaving``: the
    answer for an object leaving the slice; ``dry_run``: the client asked for one (its answer
    is checked as one)."""
    stored: Stored | None = from_cache(ctx)
    fresh = stored is None  # whether ``stored`` is kcp's own read (or is still to be made)
    unread = fresh
    for _ in range(ATTEMPTS + (0 if fresh else 1)):
        if unread:
            read = await _read(ctx)
            if isinstance(read, web.StreamResponse):
                return read
            stored, fresh, unread = read, True, False
        try:
            decision = plan(stored)
        except RequestError:
            if fresh:
                raise
            unread = True  # refused from the cache's copy: ask again with kcp's
            continue
        if not isinstance(decision, Send):
            if not fresh:
                unread = True
                continue
            if isinstance(decision, Leaving):
                assert stored is not None
                return await leaving(stored, decision.since)
            return ctx.not_found()
        assert stored is not None
        async with ctx.upstream.request(
            method,
            ctx.upstream_url,
            query=ctx.options.items if query is None else query,
            headers=ctx.upstream_headers(content_type=content_type),
            data=_encode(decision.body),
        ) as up:
            response = await relay_whole(up)
        status = response.status
        if status == 409 and decision.own_precondition and content_type != APPLY_PATCH:
            unread = True  # the proxy's precondition failed: the object changed, or the cache
            continue  # was behind
        if status in (404, 409) or (status == 422 and content_type == JSON_PATCH):
            # Deleted in between (404); a failed test (422); a conflict of the client's own
            # precondition, or of an apply (its resourceVersion, or a field manager's)?
            now = await _read(ctx)
            if isinstance(now, web.StreamResponse):
                return now
            changed = now is None or (
                now.metadata.resourceVersion != stored.metadata.resourceVersion
            )
            if now is None or (changed and (status != 409 or decision.own_precondition)):
                # Gone, or left the slice: answered as missing. Changed: planned again. A
                # client's own precondition that failed on an object still in the slice, and
                # an apply's field conflict, get kcp's 409.
                stored, fresh = now, True
                continue
        body = response.body
        raw = body if isinstance(body, bytes) else b""
        ctx.check_answer(status, raw, status_ok=method == "DELETE", written=not dry_run)
        if status in (200, 201) and not dry_run:
            wrote(ctx, raw)
        if status in (200, 201) and method != "DELETE" and not ctx.api.subresource and not dry_run:
            check_admitted(ctx, raw)
        if status == 200 and decision.leaving_since is not None:
            response.body = as_leaving(raw, decision.leaving_since)
        return response
    raise kept_changing(ctx)
