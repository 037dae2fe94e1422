"""Guarded writes: nothing a client writes through a slice may touch or create an object outside
it, and no write may move an object out of it (issue #2 §5).

Check-then-write is made race-free with optimistic concurrency instead of locks: the proxy reads
the stored object, checks it against the slice, and sends the write with a precondition on what it
checked — the stored ``resourceVersion`` for updates and patches, ``preconditions.uid`` and
``preconditions.resourceVersion`` for deletes. If the object changed in between, the upstream
answers 409 and the proxy checks again (a few times) rather than writing blind. Where the client
already sent its own precondition, the proxy leaves it alone and the client's 409 reaches it.

A patch's result cannot be computed locally for every patch type (strategic merge and server-side
apply need the schema), so patches are first sent with ``dryRun=All``: if the result would be
outside the slice the client gets 422 and nothing was written.

CREATE adds the labels the slice's ``matchLabels`` (and single-value ``In``) require when they are
absent, and refuses a conflicting value or a violated expression with a 422 naming the label.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import msgspec
import yaml
from aiohttp import web
from multidict import CIMultiDict

from vwserver.errors import BadRequest, Conflict, Invalid, MethodNotAllowed
from vwserver.k8s.types import ObjectHead
from vwserver.proxy.context import ProxyRequest
from vwserver.proxy.filtering import (
    LIST_FOOTER,
    UndecodableError,
    decode_head,
    decode_page,
    list_header,
)
from vwserver.proxy.responses import read_body, relay_whole, response_headers
from vwserver.proxy.upstream import forwarded_headers
from vwserver.selector import Requirement, Selector

# How often a check-then-write is retried when the object changed in between.
_ATTEMPTS = 3

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
_APPLY_CBOR = "application/apply-patch+cbor"

_encoder = msgspec.json.Encoder()


async def serve_create(ctx: ProxyRequest) -> web.StreamResponse:
    body = await _json_object(ctx)
    _label_for_create(body, ctx.route.selector)
    return await _send(ctx, "POST", ctx.upstream_url, body=body, query=list(ctx.query.items()))


async def serve_update(ctx: ProxyRequest) -> web.StreamResponse:
    body = await _json_object(ctx)
    if not ctx.api.subresource:
        # A status update ignores metadata changes, so only main-resource updates can relabel.
        _check_stays(_labels(body), ctx)
    return await _write_checked(ctx, "PUT", lambda stored: _with_resource_version(body, stored))


async def serve_patch(ctx: ProxyRequest) -> web.StreamResponse:
    content_type = ctx.request.content_type
    patch = await _parse_patch(ctx, content_type)
    client_dry_run = "dryRun" in ctx.query
    query = list(ctx.query.items())
    for _ in range(_ATTEMPTS):
        stored = await _stored(ctx)
        if isinstance(stored, web.StreamResponse):
            return stored
        if stored is None:
            if content_type != APPLY_PATCH or ctx.api.subresource:
                return ctx.not_found()
            # Server-side apply of a new object is a create: label it like one.
            assert isinstance(patch, dict)
            _label_for_create(patch, ctx.route.selector)
            send: dict[str, Any] | list[Any] = patch
            injected = False
        else:
            send, injected = _patch_precondition(patch, stored, content_type)
        data = _encoder.encode(send)
        # First the dry run, whose result must stay in the slice; then (unless the client
        # itself asked for a dry run) the real patch under the same precondition.
        for dry_run in (True,) if client_dry_run else (True, False):
            run_query = [*query, ("dryRun", "All")] if dry_run and not client_dry_run else query
            async with ctx.upstream.request(
                "PATCH",
                ctx.upstream_url,
                query=run_query,
                headers=_headers(ctx, content_type),
                data=data,
            ) as up:
                status = up.status
                body = await read_body(up)
                headers = response_headers(up)
            if injected and await _lost_race(ctx, status, content_type, stored):
                break  # the object changed since it was checked: check again
            if status not in (200, 201):
                return web.Response(status=status, body=body, headers=headers)
            if dry_run:
                _check_result(body, ctx)
            if dry_run and not client_dry_run:
                continue
            return web.Response(status=status, body=body, headers=headers)
        else:  # pragma: no cover - every path through the inner loop returns or breaks
            raise AssertionError("unreachable")
    raise Conflict(f'{ctx.api.resource} "{ctx.api.name}" kept changing; try again')


async def serve_delete(ctx: ProxyRequest) -> web.StreamResponse:
    if ctx.api.subresource:
        raise MethodNotAllowed(f"DELETE is not supported on subresource {ctx.api.subresource!r}")
    raw = await ctx.request.read()
    options = _decode_json(raw) if raw.strip() else {}
    if not isinstance(options, dict):
        raise BadRequest("DeleteOptions must be a JSON object")
    return await _write_checked(ctx, "DELETE", lambda stored: _with_preconditions(options, stored))


async def serve_deletecollection(ctx: ProxyRequest) -> web.StreamResponse:
    """The combined selector is pushed down; the returned list is filtered like any list."""
    raw = await ctx.request.read()
    async with ctx.upstream.request(
        "DELETE",
        ctx.upstream_url,
        query=ctx.upstream_query(),
        headers=_json_headers(ctx),
        data=raw or None,
    ) as up:
        if up.status != 200:
            return await relay_whole(up)
        body = await read_body(up)
        headers = response_headers(up)
    try:
        if not decode_head(body).kind.endswith("List"):
            return web.Response(status=200, body=body, headers=headers)
        page = decode_page(body)
    except UndecodableError:
        return web.Response(status=200, body=body, headers=headers)
    selector = ctx.route.selector
    out = (
        list_header(page, resource_version=page.resource_version, continue_token="")
        + b",".join(page.visible(selector))
        + LIST_FOOTER
    )
    return web.Response(status=200, body=out, headers=headers)


# --- helpers ---------------------------------------------------------------------------------


async def _write_checked(
    ctx: ProxyRequest,
    method: str,
    prepare: Callable[[ObjectHead], tuple[dict[str, Any], bool]],
) -> web.StreamResponse:
    """Check that the stored object is in the slice, then send the write made conditional on
    what was checked (``prepare`` says whether it added that precondition); if the object
    changed in between, check again."""
    for _ in range(_ATTEMPTS):
        stored = await _stored(ctx)
        if not isinstance(stored, ObjectHead):
            return stored or ctx.not_found()
        send, injected = prepare(stored)
        async with ctx.upstream.request(
            method,
            ctx.upstream_url,
            query=list(ctx.query.items()),
            headers=_json_headers(ctx),
            data=_encoder.encode(send),
        ) as up:
            response = await relay_whole(up)
        if injected and await _lost_race(ctx, response.status, "", stored):
            continue
        return response
    raise Conflict(f'{ctx.api.resource} "{ctx.api.name}" kept changing; try again')


def _with_preconditions(options: dict[str, Any], stored: ObjectHead) -> tuple[dict[str, Any], bool]:
    """DeleteOptions conditional on the checked uid and resourceVersion, unless the client set
    its own preconditions."""
    if "preconditions" in options:
        return options, False
    send = dict(options)
    send["preconditions"] = {
        "uid": stored.metadata.uid,
        "resourceVersion": stored.metadata.resourceVersion,
    }
    return send, True


async def _lost_race(
    ctx: ProxyRequest, status: int, content_type: str, stored: ObjectHead | None
) -> bool:
    """Whether an upstream answer means the proxy's own precondition failed.

    A failed resourceVersion precondition is 409 Conflict, but so is a server-side-apply field
    conflict; in a JSON patch it is a failed ``test`` operation, which the apiserver's patch
    handler answers with 422 like any other invalid JSON patch. So the stored object is read
    again: only if it changed did the proxy's own precondition fail.
    """
    if (status == 409 or (status == 422 and content_type == JSON_PATCH)) and stored is not None:
        now = await _stored(ctx)
        return not isinstance(now, ObjectHead) or (
            now.metadata.resourceVersion != stored.metadata.resourceVersion
        )
    return False


async def _stored(ctx: ProxyRequest) -> ObjectHead | web.StreamResponse | None:
    """The stored object's head if it exists and is in the slice; None if it does not exist;
    the NotFound response if it exists outside the slice; an upstream error response as is.

    Callers answer "missing" with the same NotFound, except server-side apply, for which a
    missing object is a create.
    """
    async with ctx.upstream.request(
        "GET", ctx.object_url, headers=CIMultiDict({"Accept": "application/json"})
    ) as up:
        if up.status == 404:
            return None
        if up.status != 200:
            return await relay_whole(up)
        body = await read_body(up)
    head = decode_head(body)
    if not ctx.route.selector.matches(head.metadata.labels):
        return ctx.not_found()
    return head


def _check_result(body: bytes, ctx: ProxyRequest) -> None:
    _check_stays(decode_head(body).metadata.labels, ctx)


def _check_stays(labels: dict[str, str] | None, ctx: ProxyRequest) -> None:
    violations = ctx.route.selector.violations(labels)
    if violations:
        raise _invalid(
            ctx,
            violations,
            message=(
                f'{ctx.api.resource} "{ctx.api.name}": the change would move the object out of '
                f"the slice {ctx.route.cluster}/{ctx.route.name} (labels must satisfy "
                f"{ctx.route.selector.render()!r})"
            ),
        )


def _label_for_create(body: dict[str, Any], selector: Selector) -> None:
    meta = body.setdefault("metadata", {})
    if not isinstance(meta, dict):
        raise BadRequest("metadata must be an object")
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict):
        raise BadRequest("metadata.labels must be an object")
    for key, value in selector.required_labels().items():
        if key in labels and labels[key] != value:
            raise Invalid(
                f"metadata.labels[{key}]: {labels[key]!r} conflicts with the slice, "
                f"which requires {key}={value}",
                details={"causes": [_cause(key, f"must be {value!r} in this slice")]},
            )
        labels.setdefault(key, value)
    meta["labels"] = labels
    violations = selector.violations(labels)
    if violations:
        names = ", ".join(f"metadata.labels[{r.key}]" for r in violations)
        raise Invalid(
            f"{names}: the object would be outside the slice "
            f"(labels must satisfy {selector.render()!r})",
            details={"causes": [_cause(r.key, f"must satisfy {r.render()}") for r in violations]},
        )


def _invalid(ctx: ProxyRequest, violations: list[Requirement], *, message: str) -> Invalid:
    # kubectl prints the causes rather than the message when there are any: say it there too.
    details: dict[str, object] = {
        "name": ctx.api.name,
        "group": ctx.api.group,
        "kind": ctx.api.resource,
        "causes": [
            _cause(
                r.key,
                f"must satisfy {r.render()}: the change would move the object out of "
                f"the slice {ctx.route.cluster}/{ctx.route.name}",
            )
            for r in violations
        ],
    }
    return Invalid(message, details=details)


def _cause(key: str, message: str) -> dict[str, str]:
    return {"reason": "FieldValueInvalid", "message": message, "field": f"metadata.labels[{key}]"}


def _labels(body: dict[str, Any]) -> dict[str, str] | None:
    meta = body.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    return labels if isinstance(labels, dict) else None


def _with_resource_version(body: dict[str, Any], stored: ObjectHead) -> tuple[dict[str, Any], bool]:
    meta = body.get("metadata")
    if isinstance(meta, dict) and meta.get("resourceVersion"):
        return body, False
    send = copy.copy(body)
    send["metadata"] = {**(meta or {}), "resourceVersion": stored.metadata.resourceVersion}
    return send, True


def _patch_precondition(
    patch: dict[str, Any] | list[Any], stored: ObjectHead, content_type: str
) -> tuple[dict[str, Any] | list[Any], bool]:
    """The patch made conditional on the resourceVersion the proxy checked."""
    rv = stored.metadata.resourceVersion
    if isinstance(patch, list):  # JSON patch: a leading test op is the precondition
        if any(
            op.get("path") == "/metadata/resourceVersion" for op in patch if isinstance(op, dict)
        ):
            return patch, False
        return [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}, *patch], True
    meta = patch.get("metadata")
    if isinstance(meta, dict) and meta.get("resourceVersion"):
        return patch, False
    # merge, strategic merge and apply patches carrying metadata.resourceVersion are
    # preconditions: the apiserver answers 409 Conflict when it differs.
    send = dict(patch)
    send["metadata"] = {**(meta if isinstance(meta, dict) else {}), "resourceVersion": rv}
    return send, True


async def _parse_patch(ctx: ProxyRequest, content_type: str) -> dict[str, Any] | list[Any]:
    raw = await ctx.request.read()
    if content_type == JSON_PATCH:
        patch = _decode_json(raw)
        if not isinstance(patch, list):
            raise BadRequest("a JSON patch must be a JSON array of operations")
        return patch
    if content_type in (MERGE_PATCH, STRATEGIC_PATCH):
        patch = _decode_json(raw)
    elif content_type == APPLY_PATCH:
        try:
            patch = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise BadRequest(f"apply patch is not valid YAML: {e}") from e
    elif content_type == _APPLY_CBOR:
        raise BadRequest(f"{content_type} is not supported by this endpoint; use {APPLY_PATCH}")
    else:
        raise BadRequest(f"unsupported patch content type {content_type!r}")
    if not isinstance(patch, dict):
        raise BadRequest("the patch must be a JSON object")
    return patch


async def _json_object(ctx: ProxyRequest) -> dict[str, Any]:
    if ctx.request.content_type not in ("application/json", ""):
        raise BadRequest(
            f"content type {ctx.request.content_type!r} is not supported; send application/json"
        )
    body = _decode_json(await ctx.request.read())
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def _decode_json(raw: bytes) -> Any:
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        raise BadRequest(f"the request body is not valid JSON: {e}") from e


def _json_headers(ctx: ProxyRequest) -> CIMultiDict[str]:
    return _headers(ctx, "application/json")


def _headers(ctx: ProxyRequest, content_type: str) -> CIMultiDict[str]:
    headers = forwarded_headers(ctx.request.headers)
    headers["Content-Type"] = content_type
    return headers


async def _send(
    ctx: ProxyRequest, method: str, url: str, *, body: dict[str, Any], query: list[tuple[str, str]]
) -> web.StreamResponse:
    async with ctx.upstream.request(
        method, url, query=query, headers=_json_headers(ctx), data=_encoder.encode(body)
    ) as up:
        return await relay_whole(up)
