"""Guarded writes: nothing a client writes through a slice may touch or create an object outside
it, and no write may move an object out of it.

Check-then-write is made race-free with optimistic concurrency instead of locks: the proxy reads
the stored object (from the shared watch cache when it has it), checks it against the slice, and
sends the write with a precondition on what it checked — the stored ``resourceVersion`` for
updates and patches, ``preconditions.uid`` and ``preconditions.resourceVersion`` for deletes. If
the object changed in between (or the cache was behind), the upstream answers 409 and the proxy
checks again from kcp's own read (a few times) rather than writing blind. The rules are one pure
plan per verb (:mod:`vwserver.proxy.write_plan`); :mod:`vwserver.proxy.write_io` does the I/O.

The precondition is the proxy's, whatever the client sends: a client cannot switch it off.

* A client's own precondition (``metadata.resourceVersion`` in an update or a merge/apply patch,
  ``preconditions`` in DeleteOptions, a JSON patch ``test`` op) is *combined* with the proxy's:
  if it disagrees with the object the proxy checked, the client gets the apiserver's 409
  Conflict; if it agrees, the one precondition serves both.
* A JSON patch always starts with the proxy's ``test`` of ``/metadata/resourceVersion``, and any
  other operation that writes ``/metadata/resourceVersion``, ``/metadata`` or the whole document
  (``copy``/``move``/``replace``/``add``/``remove``) is refused with 422: it could change the
  version the precondition is checked against.
* JSON-patch pointers are read as RFC 6901 says (kcp's JSON patch ignores what precedes the
  first ``/``, so ``x/metadata/resourceVersion`` would alias ``/metadata/resourceVersion``):
  anything else is 422, and the checks compare decoded reference tokens.
* DeleteOptions travel in the body the proxy sends (its preconditions); the apiserver ignores
  DeleteOptions query parameters when there is a body, so the client's are moved into it
  (:func:`_delete_options`), and a DELETE whose effective propagation would make kcp's garbage
  collector delete dependents outside the slice is refused (:mod:`vwserver.proxy.dependents`).
* DELETECOLLECTION is carried out by the proxy as a filtered list followed by one conditional
  DELETE per visible object; the apiserver's own collection delete has no per-object
  precondition, so an object relabelled out of the slice between its list and its delete would
  be deleted.

Merge and JSON patches are applied by the proxy to the checked object
(:mod:`vwserver.proxy.patches`, kcp's semantics), the result checked, and the client's patch sent
as one conditional write. A ``status`` write changes status only (kcp's status strategy keeps
the rest of the stored object): one conditional write. Server-side apply (field ownership needs
kcp's schema and managedFields) and strategic merge keep a dry run: first sent with
``dryRun=All`` under the same precondition; if the result would be outside the slice the client
gets 422 and nothing was written; the real patch then applies to exactly the object the dry run
saw, or fails with 409 (an apply's write that changes the holds the proxy records is forced:
the dry run showed the client's fields free of conflicts,
:func:`vwserver.proxy.write_plan.apply_write_query`). An apply whose result stays in the slice
whatever field ownership decides — its labels bound between the configuration's and the stored
ones overridden by them, no finalizer, hold or holder label stored or configured
(:func:`vwserver.proxy.write_plan.apply_result_decided`) — is the one conditional write. With
``mutatingAdmission`` (the provider's workspace runs mutating admission, which kcp applies after
the patch: :data:`vwserver.proxy.patches.ADMISSION`) merge and JSON patches take the dry-run path
too, and every apply keeps its dry run, so that the result checked is the one kcp would store.

CREATE adds the labels the slice's ``matchLabels`` (and single-value ``In``) require when they are
absent, and refuses a conflicting value or a violated expression with a 422 naming the label.

Every object kcp answers is checked against the request's scope
(:class:`~vwserver.proxy.filtering.Scope`: its logical cluster, namespace and name — for a
create the name sent, or the ``generateName`` prefix of the name kcp generates): the stored
object read before a write is treated as missing when it is outside (404, nothing written); a
write's answer outside it is not forwarded — the write was carried out, so the client gets 502
(:meth:`ProxyRequest.check_answer`), counted like every out-of-scope object.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgspec
from aiohttp import web

from vwserver.errors import BadRequest, Conflict, Invalid, MethodNotAllowed, UpstreamUnavailable
from vwserver.k8s.types import ObjectMeta
from vwserver.proxy import dependents, holding, write_io, write_plan
from vwserver.proxy.bodies import decode_json, decode_yaml
from vwserver.proxy.context import ProxyRequest
from vwserver.proxy.filtering import Scope, UndecodableError, decode_head, decode_page
from vwserver.proxy.holding import Stored
from vwserver.proxy.options import (
    DELETE_QUERY,
    LIST_QUERY,
    PROPAGATION_POLICIES,
    delete_options,
)
from vwserver.proxy.responses import read_body, relay_whole, response_headers
from vwserver.proxy.write_plan import labels_of, with_resource_version
from vwserver.selector import Selector

# The apiserver's generated names (k8s.io/apiserver/pkg/storage/names): generateName cut to
# 63 - 5 characters, then 5 random ones.
_GENERATED_BASE = 58

JSON = "application/json"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
_APPLY_CBOR = "application/apply-patch+cbor"

# JSON pointers (as RFC 6901 reference tokens) a client's JSON patch may only `test`: writing
# them could move the version the proxy's precondition is checked against ("" is the whole
# document).
_PROXY_OWNED_TOKENS: frozenset[tuple[str, ...]] = frozenset(
    {(), ("metadata",), ("metadata", "resourceVersion")}
)
_JSON_PATCH_OPS = frozenset({"add", "remove", "replace", "move", "copy", "test"})
# DeleteOptions fields a client may send (metav1.DeleteOptions, without the unsafe
# ignoreStoreReadErrorWithClusterBreakingPotential).
_DELETE_OPTIONS = frozenset(
    {
        "kind",
        "apiVersion",
        "gracePeriodSeconds",
        "preconditions",
        "orphanDependents",
        "propagationPolicy",
        "dryRun",
    }
)

_encoder = msgspec.json.Encoder()


async def serve_create(ctx: ProxyRequest) -> web.StreamResponse:
    body = await _json_object(ctx)
    _label_for_create(body, ctx.route.selector)
    if ctx.member.claimed is not None:
        meta = body["metadata"]
        name = meta.get("name")
        write_plan.check_claimed(
            ctx, labels=meta.get("labels"), name=name if isinstance(name, str) else ""
        )
    holding.prepare_create(ctx, body)
    async with ctx.upstream.request(
        "POST",
        ctx.upstream_url,
        query=ctx.options.items,
        headers=ctx.upstream_headers(content_type=JSON),
        data=_encoder.encode(body),
    ) as up:
        response = await relay_whole(up)
    dry_run = ctx.options.get("dryRun") == "All"
    ctx.check_answer(
        response.status,
        _body(response),
        scope=create_scope(ctx.scope, body),
        written=not dry_run,
    )
    return response


def create_scope(scope: Scope, body: dict[str, Any]) -> Scope:
    """What a create's answer must be: the object named in ``body`` — or, with only
    ``generateName``, one whose name kcp generated from it — in the request's cluster and
    namespace (``scope``). A name wins over generateName, as in the apiserver."""
    meta = body.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    name, generate = meta.get("name"), meta.get("generateName")
    if isinstance(name, str) and name:
        return replace(scope, name=name)
    if isinstance(generate, str) and generate:
        return replace(scope, name_prefix=generate[:_GENERATED_BASE])
    return scope


def _body(response: web.Response) -> bytes:
    body = response.body
    return body if isinstance(body, bytes) else b""


async def serve_update(ctx: ProxyRequest) -> web.StreamResponse:
    body = await _json_object(ctx)
    labels_of(body)  # 400 for labels that are not strings, before anything is read

    async def leaving(stored: Stored, since: str) -> web.StreamResponse:
        send = with_resource_version(holding.strip_leaving(body, stored), stored, ctx)
        return await holding.serve_leaving(
            ctx,
            stored,
            since,
            method="PUT",
            content_type=JSON,
            data=_encoder.encode(send),
            client_dry_run=ctx.options.get("dryRun") == "All",
        )

    return await write_io.execute(
        ctx,
        "PUT",
        lambda stored: write_plan.plan_update(ctx, body, stored),
        leaving=leaving,
        dry_run=ctx.options.get("dryRun") == "All",
    )


async def serve_patch(ctx: ProxyRequest) -> web.StreamResponse:
    content_type = ctx.request.content_type
    patch = await _parse_patch(ctx, content_type)
    if content_type == APPLY_PATCH and "fieldManager" not in ctx.options:
        # The apiserver's validation of PatchOptions, answered before the object is looked up.
        raise Invalid(
            'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
            "is required for apply patch",
            details={
                "group": "meta.k8s.io",
                "kind": "PatchOptions",
                "causes": [
                    {
                        "reason": "FieldValueRequired",
                        "message": "Required value: is required for apply patch",
                        "field": "fieldManager",
                    }
                ],
            },
        )
    if content_type == APPLY_PATCH and not ctx.api.subresource:
        # An apply may create the object: its configuration is labelled and checked like a
        # create *before* the stored object is looked at, so an apply naming an object outside
        # the slice is refused exactly like one naming a missing object (no existence oracle).
        # A configuration must therefore keep the object in the slice by itself.
        # Its metadata.resourceVersion, though, is a precondition on the stored object, checked
        # after the lookup (present and missing: NotFound; present and stored: as for merge
        # patches, 409 unless it is the stored one).
        assert isinstance(patch, dict)
        _label_for_create(patch, ctx.route.selector, precondition=True)
        if ctx.member.claimed is not None:
            write_plan.check_claimed(ctx, labels=patch["metadata"].get("labels"), name=ctx.api.name)
    if ctx.api.subresource:
        # The status subresource ignores everything but status: one conditional write.
        return await write_io.execute(
            ctx,
            "PATCH",
            lambda stored: write_plan.plan_status_patch(
                ctx, patch, stored, content_type=content_type
            ),
            leaving=lambda stored, _since: _refuse_leaving(ctx, stored),
            content_type=content_type,
            dry_run=ctx.options.get("dryRun") == "All",
        )
    if content_type in write_plan.LOCAL_PATCHES and not ctx.mutating_admission:
        return await write_io.execute(
            ctx,
            "PATCH",
            lambda stored: write_plan.plan_patch(
                ctx,
                patch,
                stored,
                content_type=content_type,
                # The apiserver's default: Warn (the checked query holds a valid value).
                field_validation=ctx.options.get("fieldValidation") or "Warn",
            ),
            leaving=lambda stored, since: holding.serve_leaving(
                ctx,
                stored,
                since,
                method="PATCH",
                content_type=content_type,
                data=_encoder.encode(write_plan.patch_precondition(patch, stored, ctx)),
                client_dry_run=ctx.options.get("dryRun") == "All",
            ),
            content_type=content_type,
            dry_run=ctx.options.get("dryRun") == "All",
        )
    return await _patch_with_dry_run(ctx, patch, content_type)


async def _refuse_leaving(ctx: ProxyRequest, stored: Stored) -> web.StreamResponse:
    raise holding.leaving_refusal(ctx, stored)


async def _patch_with_dry_run(
    ctx: ProxyRequest, patch: dict[str, Any] | list[Any], content_type: str
) -> web.StreamResponse:
    """A patch whose result the proxy cannot compute (server-side apply's field ownership, a
    strategic merge): first a dry run under the proxy's precondition, whose result must stay in
    the slice, then the patch under the same precondition. The stored object may come from the
    cache (:func:`vwserver.proxy.write_io.from_cache`): a dry run that succeeds under its
    resourceVersion proves it current; what is decided before the dry run from the cache's
    copy (a client's precondition that disagrees, an object leaving) is decided again from
    kcp's."""
    client_dry_run = ctx.options.get("dryRun") == "All"
    query = ctx.options.items
    headers = ctx.upstream_headers(content_type=content_type)
    cached = write_io.from_cache(ctx)
    # The next object to check when already read: the cache's (not fresh), or kcp's own read
    # after a lost race (fresh); None: read kcp.
    pending: _Reread | None = None if cached is None else _Reread(cached, fresh=False)
    for _ in range(write_io.ATTEMPTS + (cached is not None)):
        if pending is None:
            read, fresh = await write_io.from_kcp(ctx), True
        else:
            read, fresh = pending.read, pending.fresh
        pending = None
        if isinstance(read, web.StreamResponse):
            return read
        stored: Stored | None = read
        if stored is None:
            if content_type != APPLY_PATCH:
                return ctx.not_found()
            if isinstance(patch, dict) and (patch.get("metadata") or {}).get("resourceVersion"):
                # An apply conditional on a version of an object that does not exist: the
                # object is missing (the apiserver would refuse it as a create).
                return ctx.not_found()
            # Server-side apply of a new object is a create (labelled above).
            send: dict[str, Any] | list[Any] = patch
        else:
            since = ctx.leaving(stored.metadata)
            try:
                send = write_plan.patch_precondition(patch, stored, ctx)
            except Conflict:
                if fresh:
                    raise
                continue  # the cache's copy disagrees with the client's: ask kcp
            if content_type == APPLY_PATCH:
                send = holding.keep_holds(send, stored)
            if since is not None:
                if not fresh:
                    continue
                return await holding.serve_leaving(
                    ctx,
                    stored,
                    since,
                    method="PATCH",
                    content_type=content_type,
                    data=_encoder.encode(send),
                    client_dry_run=client_dry_run,
                )
        data = _encoder.encode(send)
        # First the dry run, whose result must stay in the slice; then (unless the client
        # itself asked for a dry run) the real patch under the same precondition. An apply
        # whose result stays in the slice whatever its field ownership decides needs no dry run
        # (write_plan.apply_result_decided): one conditional write.
        runs: tuple[bool, ...] = (True,) if client_dry_run else (True, False)
        if (
            content_type == APPLY_PATCH
            and not client_dry_run
            and stored is not None
            and not ctx.mutating_admission
            and write_plan.apply_result_decided(ctx, send, stored)
        ):
            runs = (False,)
        lost = False
        write_query: Sequence[tuple[str, str]] = query
        for dry_run in runs:
            run_query = (
                [*query, ("dryRun", "All")] if dry_run and not client_dry_run else write_query
            )
            async with ctx.upstream.request(
                "PATCH", ctx.upstream_url, query=run_query, headers=headers, data=data
            ) as up:
                status = up.status
                body = await read_body(up)
                response_head = response_headers(up)
            pending = await _lost_race(ctx, status, content_type, stored)
            if pending is not None:
                lost = True
                break  # the object changed since it was checked: check again, from kcp's read
            # A dry run's result and the patch's answer alike.
            ctx.check_answer(status, body, written=not dry_run)
            if status in (200, 201) and not dry_run:
                # The next write of the object is checked against this answer, not against the
                # older version the cache's stream may still show (a 409 and a GET more).
                write_io.wrote(ctx, body)
                write_io.check_admitted(ctx, body)
            if status not in (200, 201) or not dry_run:
                return web.Response(status=status, body=body, headers=response_head)
            write_plan.check_result(body, ctx, stored)
            plan = holding.plan_patch(ctx, stored, body)  # stored None: an apply creates
            data = _encoder.encode(
                holding.with_holds(send, plan, content_type=content_type, result=body)
            )
            if content_type == APPLY_PATCH:
                write_query = write_plan.apply_write_query(query, plan)
            if client_dry_run:
                return web.Response(status=status, body=body, headers=response_head)
        if not lost:  # pragma: no cover - every path through the inner loop returns or breaks
            raise AssertionError("unreachable")
    raise write_plan.kept_changing(ctx)


async def serve_delete(ctx: ProxyRequest) -> web.StreamResponse:
    if ctx.api.subresource:
        raise MethodNotAllowed(f"DELETE is not supported on subresource {ctx.api.subresource!r}")
    options = await _delete_options(ctx)

    async def leaving(stored: Stored, since: str) -> web.StreamResponse:
        raise holding.leaving_refusal(ctx, stored)

    async with dependents.checking(ctx) as dependent_check:

        def plan(stored: Stored | None) -> write_plan.Decision:
            decision = write_plan.plan_delete(ctx, options, stored)
            if isinstance(decision, write_plan.Send) and stored is not None:
                meta = stored.metadata
                assert isinstance(decision.body, dict)
                dependent_check.check(
                    uid=meta.uid,
                    namespace=meta.namespace,
                    finalizers=meta.finalizers,
                    options=decision.body,
                )
            return decision

        return await write_io.execute(
            ctx,
            "DELETE",
            plan,
            leaving=leaving,
            # The options are in the body (the apiserver would ignore them in the query).
            query=ctx.options.without(*DELETE_QUERY),
            dry_run=bool(options.get("dryRun")),
        )


async def serve_deletecollection(ctx: ProxyRequest) -> web.StreamResponse:
    """A filtered list, then one DELETE per visible object, each conditional on the uid and
    resourceVersion it was listed with; the answer is the list of what was deleted, like the
    apiserver's."""
    options = await _delete_options(ctx)
    if "preconditions" in options:
        raise BadRequest("preconditions are not supported for deletecollection")
    ctx.effective_selector()  # 400 for a malformed labelSelector, before anything is done
    list_query = [
        *ctx.upstream_query(drop=(*DELETE_QUERY, "limit")),
        ("limit", str(ctx.page_size)),
    ]
    # Each delete carries the options in its body (the apiserver would ignore them in the query).
    delete_query = ctx.options.without(*DELETE_QUERY, *LIST_QUERY)
    async with dependents.checking(ctx) as dependent_check:
        return await _delete_listed(
            ctx,
            list_query=list_query,
            delete_query=delete_query,
            options=options,
            dependent_check=dependent_check,
        )


async def _delete_listed(
    ctx: ProxyRequest,
    *,
    list_query: list[tuple[str, str]],
    delete_query: list[tuple[str, str]],
    options: dict[str, Any],
    dependent_check: dependents.DependentCheck,
) -> web.StreamResponse:
    selector = ctx.effective_selector()
    headers = ctx.upstream_headers()
    deleted: list[bytes] = []
    kind = api_version = ""
    continue_token = ""
    while True:
        query = [*list_query, ("continue", continue_token)] if continue_token else list_query
        async with ctx.upstream.request(
            "GET", ctx.collection_url, query=query, headers=headers
        ) as up:
            if up.status != 200:
                return await relay_whole(up)
            body = await read_body(up)
        try:
            page = decode_page(body, scope=ctx.scope)
        except UndecodableError as e:
            raise UpstreamUnavailable(f"upstream sent an undecodable list: {e}") from e
        ctx.out_of_scope(page.out_of_scope)
        kind, api_version = page.kind, page.api_version
        # Listed by their labels; an object another slice holds (or that is leaving this one)
        # is not deleted. The page's metadata is decoded once, by decode_page.
        targets = [
            (raw, meta)
            for raw, meta in zip(page.entries, page.metas, strict=True)
            if meta is not None
            and selector.matches(meta.labels)
            and ctx.sees(meta)
            and ctx.leaving(meta) is None
        ]
        # The page's dependents are checked before any of it is deleted (in memory: the cache).
        for _, meta in targets:
            dependent_check.check(
                uid=meta.uid, namespace=meta.namespace, finalizers=meta.finalizers, options=options
            )
        for raw, meta in targets:
            answer = await _delete_one(ctx, raw, meta, options=options, query=delete_query)
            if isinstance(answer, web.Response):
                return answer
            if answer is not None:
                deleted.append(answer)
        continue_token = page.continue_token
        if not continue_token:
            break
    out = (
        b'{"kind":'
        + _encoder.encode(kind)
        + b',"apiVersion":'
        + _encoder.encode(api_version)
        + b',"metadata":{},"items":['
        + b",".join(deleted)
        + b"]}\n"
    )
    return web.Response(status=200, body=out, content_type="application/json")


async def _delete_one(
    ctx: ProxyRequest,
    listed: msgspec.Raw,
    meta: ObjectMeta,
    *,
    options: dict[str, Any],
    query: list[tuple[str, str]],
) -> bytes | web.Response | None:
    """Delete one listed object (``meta``: its metadata as listed) conditionally: the object
    (as deleted, or being deleted), None when it changed or vanished since it was listed (then
    it is no longer the object the client's selector chose), or an upstream error to relay."""
    send = dict(options)
    send["preconditions"] = {"uid": meta.uid, "resourceVersion": meta.resourceVersion}
    async with ctx.upstream.request(
        "DELETE",
        ctx.item_url(namespace=meta.namespace, name=meta.name),
        query=query,
        headers=ctx.upstream_headers(content_type=JSON),
        data=_encoder.encode(send),
    ) as up:
        if up.status in (404, 409):
            return None
        if up.status not in (200, 202):
            return await relay_whole(up)
        status, body = up.status, await read_body(up)
    ctx.check_answer(
        status,
        body,
        scope=replace(ctx.scope, namespace=meta.namespace, name=meta.name),
        status_ok=True,
        written=not send.get("dryRun"),
    )
    # A DELETE answers with the object, or with a Success Status once it is gone: the list
    # holds the object either way, like the apiserver's.
    return bytes(listed) if decode_head(body).kind == "Status" else body


# --- helpers ---------------------------------------------------------------------------------


async def _delete_options(ctx: ProxyRequest) -> dict[str, Any]:
    """The client's DeleteOptions, from its body if it sent one, else from its query.

    The apiserver decodes DeleteOptions from the body when there is one and then ignores the
    DeleteOptions query parameters; without a body it reads them from the query
    (handlers/delete.go). The proxy always sends a body (its preconditions), so the client's
    query options go into it. A client that sends both has two readings (the apiserver's and the
    one it meant): 400, naming the parameters."""
    raw = await ctx.request.read()
    in_query = [name for name in DELETE_QUERY if name in ctx.options]
    if not raw.strip():
        return delete_options(ctx.options)
    if in_query:
        raise BadRequest(
            f"DeleteOptions given both in the body and as query parameters "
            f"({', '.join(in_query)}): send them in one place"
        )
    options = decode_json(raw)
    if not isinstance(options, dict):
        raise BadRequest("DeleteOptions must be a JSON object")
    unknown = sorted(set(options) - _DELETE_OPTIONS)
    if unknown:
        raise BadRequest(f"DeleteOptions: unsupported field(s) {', '.join(unknown)}")
    _check_delete_options(options)
    return options


def _check_delete_options(options: dict[str, Any]) -> None:
    """The body's fields of the types the apiserver decodes them to (the proxy reads
    ``propagationPolicy``/``orphanDependents`` and ``preconditions`` itself: one reading)."""
    pre = options.get("preconditions")
    if pre is not None and (
        not isinstance(pre, dict)
        or set(pre) - {"uid", "resourceVersion"}
        or not all(v is None or isinstance(v, str) for v in pre.values())
    ):
        raise BadRequest("DeleteOptions.preconditions: only string uid and resourceVersion")
    dry_run = options.get("dryRun")
    if dry_run is not None and (not isinstance(dry_run, list) or any(v != "All" for v in dry_run)):
        raise BadRequest('DeleteOptions.dryRun: must be a list of "All"')
    grace = options.get("gracePeriodSeconds")
    if grace is not None and (isinstance(grace, bool) or not isinstance(grace, int)):
        raise BadRequest("DeleteOptions.gracePeriodSeconds: must be an integer")
    policy = options.get("propagationPolicy")
    if policy is not None and policy not in PROPAGATION_POLICIES:
        raise BadRequest(
            f"DeleteOptions.propagationPolicy: must be one of {', '.join(PROPAGATION_POLICIES)}"
        )
    orphan = options.get("orphanDependents")
    if orphan is not None and not isinstance(orphan, bool):
        raise BadRequest("DeleteOptions.orphanDependents: must be true or false")
    for key in ("kind", "apiVersion"):
        if options.get(key) is not None and not isinstance(options[key], str):
            raise BadRequest(f"DeleteOptions.{key}: must be a string")


async def _lost_race(
    ctx: ProxyRequest, status: int, content_type: str, stored: Stored | None
) -> _Reread | None:
    """Whether an upstream answer means the proxy's own precondition failed: then kcp's fresh
    read of the object (to check it again from), else None.

    A failed resourceVersion precondition is 409 Conflict, but so is a server-side-apply field
    conflict; in a JSON patch it is a failed ``test`` operation, which the apiserver's patch
    handler answers with 422 like any other invalid JSON patch. An object deleted between the
    check and the write answers 404 — or, for an apply, which then takes the apiserver's create
    path with the proxy's resourceVersion still set, 500 "resourceVersion should not be set on
    objects to be created". So the stored object is read again: only if it changed (or is gone)
    did the proxy's own precondition fail, and the write is checked again from the start.
    """
    racing = status in (409, 404) or (
        (status == 422 and content_type == JSON_PATCH)
        or (status == 500 and content_type == APPLY_PATCH)
    )
    if racing and stored is not None:
        now = await write_io.from_kcp(ctx)
        if not isinstance(now, Stored) or (
            now.metadata.resourceVersion != stored.metadata.resourceVersion
        ):
            return _Reread(now)
    return None


@dataclass(frozen=True, slots=True)
class _Reread:
    """kcp's read of the object after a lost race (:func:`vwserver.proxy.write_io.from_kcp`)."""

    read: Stored | web.StreamResponse | None
    fresh: bool = True
    """kcp's own read (False: the shared cache's copy)."""


def _label_for_create(
    body: dict[str, Any], selector: Selector, *, precondition: bool = False
) -> None:
    """``body`` labelled as the slice requires; 422 if it cannot be in the slice.
    ``precondition``: a resourceVersion in it is a precondition checked later (an apply),
    not the create's mistake."""
    meta = body.setdefault("metadata", {})
    if not isinstance(meta, dict):
        raise BadRequest("metadata must be an object")
    if not precondition and meta.get("resourceVersion"):
        # The apiserver answers this with a 500; it is the client's mistake.
        raise BadRequest("metadata.resourceVersion must not be set on objects to be created")
    labels = meta.get("labels") or {}
    write_plan.check_labels(labels)
    for key, value in selector.required_labels().items():
        if key in labels and labels[key] != value:
            raise Invalid(
                f"metadata.labels[{key}]: {labels[key]!r} conflicts with the slice, "
                f"which requires {key}={value}",
                details={"causes": [write_plan.cause(key, f"must be {value!r} in this slice")]},
            )
        labels.setdefault(key, value)
    meta["labels"] = labels
    violations = selector.violations(labels)
    if violations:
        names = ", ".join(f"metadata.labels[{r.key}]" for r in violations)
        raise Invalid(
            f"{names}: the object would be outside the slice "
            f"(labels must satisfy {selector.render()!r})",
            details={
                "causes": [
                    write_plan.cause(r.key, f"must satisfy {r.render()}") for r in violations
                ]
            },
        )


class PointerError(ValueError):
    """A string that is no RFC 6901 JSON pointer."""


def pointer_tokens(pointer: str) -> tuple[str, ...]:
    """The reference tokens of an RFC 6901 JSON pointer, unescaped: ``""`` is the whole
    document, anything else starts with ``/``; ``~`` appears only as ``~0`` (``~``) or ``~1``
    (``/``). Raises :class:`PointerError` for anything else.

    kcp's JSON patch (evanphx/json-patch v4) does not check this: it ignores whatever precedes
    the first ``/`` (``x/metadata/resourceVersion`` addresses ``/metadata/resourceVersion``),
    so the proxy reads only pointers both sides read the same way."""
    if pointer == "":
        return ()
    if not pointer.startswith("/"):
        raise PointerError("must be empty or start with '/'")
    tokens = pointer[1:].split("/")
    for token in tokens:
        rest = token
        while (i := rest.find("~")) >= 0:
            if rest[i + 1 : i + 2] not in ("0", "1"):
                raise PointerError("'~' must be followed by '0' or '1'")
            rest = rest[i + 2 :]
    # ~1 first, then ~0 (RFC 6901, section 4): "~01" is "~1", not "/".
    return tuple(t.replace("~1", "/").replace("~0", "~") for t in tokens)


_LABELS_TOKENS = ("metadata", "labels")


def _check_json_patch(ops: list[Any]) -> None:
    for i, op in enumerate(ops):
        if not isinstance(op, dict) or op.get("op") not in _JSON_PATCH_OPS:
            raise BadRequest(f"JSON patch operation {i}: not an RFC 6902 operation")
        names = ["path"]
        if op["op"] in ("move", "copy"):
            names.append("from")
        tokens: dict[str, tuple[str, ...]] = {}
        for name in names:
            pointer = op.get(name)
            if not isinstance(pointer, str):
                raise BadRequest(f"JSON patch operation {i}: {name} must be a string")
            try:
                tokens[name] = pointer_tokens(pointer)
            except PointerError as e:
                # What kcp answers for a patch it cannot apply: 422 (the apiserver's patch
                # handler), here before anything reaches kcp.
                raise Invalid(
                    f"JSON patch operation {i}: {name} {pointer!r} is not a JSON pointer "
                    f"(RFC 6901): {e}",
                    details={
                        "causes": [
                            {"reason": "FieldValueInvalid", "message": str(e), "field": name}
                        ]
                    },
                ) from e
        if op["op"] in ("add", "replace"):
            # Values written into labels must be strings (a map of strings for the whole map).
            path, value = tokens["path"], op.get("value")
            if path == _LABELS_TOKENS:
                write_plan.check_labels(value)
            elif len(path) == 3 and path[:2] == _LABELS_TOKENS and not isinstance(value, str):
                raise BadRequest(f"JSON patch operation {i}: a label value must be a string")
        written = [tokens["path"]]
        if op["op"] == "move":
            written.append(tokens["from"])  # a move removes its source
        for where in written:
            if op["op"] != "test" and where in _PROXY_OWNED_TOKENS:
                raise Invalid(
                    f"JSON patch operation {i} ({op['op']} {op.get('path')!r}): "
                    "metadata.resourceVersion is the precondition of every write through a "
                    "slice; it may only be tested",
                    details={
                        "causes": [
                            {
                                "reason": "FieldValueForbidden",
                                "message": "may only be used in a test operation",
                                "field": "metadata.resourceVersion",
                            }
                        ]
                    },
                )


async def _parse_patch(ctx: ProxyRequest, content_type: str) -> dict[str, Any] | list[Any]:
    raw = await ctx.request.read()
    if content_type == JSON_PATCH:
        patch = decode_json(raw)
        if not isinstance(patch, list):
            raise BadRequest("a JSON patch must be a JSON array of operations")
        _check_json_patch(patch)
        return patch
    if content_type in (MERGE_PATCH, STRATEGIC_PATCH):
        patch = decode_json(raw)
        meta = patch.get("metadata") if isinstance(patch, dict) else None
        if isinstance(meta, dict):
            write_plan.check_labels(meta.get("labels"), deletions=True)
    elif content_type == APPLY_PATCH:
        patch = decode_yaml(raw)
    elif content_type == _APPLY_CBOR:
        raise BadRequest(f"{content_type} is not supported by this endpoint; use {APPLY_PATCH}")
    else:
        raise BadRequest(f"unsupported patch content type {content_type!r}")
    if not isinstance(patch, dict):
        raise BadRequest("the patch must be a JSON object")
    return patch


async def _json_object(ctx: ProxyRequest) -> dict[str, Any]:
    if ctx.request.content_type not in (JSON, ""):
        raise BadRequest(
            f"content type {ctx.request.content_type!r} is not supported; send application/json"
        )
    body = decode_json(await ctx.request.read())
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body
