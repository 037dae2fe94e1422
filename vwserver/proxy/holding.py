"""Writes and holds: the proxy's half of the handoff between slices (:mod:`vwserver.holds`).

Every write through a slice keeps the holds annotation true in the *same* request that changes
the finalizers, so that kcp alone records which slice holds what:

* a finalizer the write adds is recorded for the slice (where the slice records holds);
* a finalizer another slice holds can be removed while that slice still sees the object as a
  member (its entry loses the finalizer in the same write), never while the object is leaving
  that slice (422, naming the finalizer and the slice; :func:`vwserver.holds.guards`);
* no client writes the holds or the release annotation, or a holder label
  (:func:`vwserver.holds.holder_label`: one per slice with an entry, what a pass-through LIST
  asks kcp for), through a slice: a PUT gets the proxy's values put back; a create or a patch
  whose result would change any of them is refused (422);
* the annotation goes in as part of the write itself — a member of a merge, strategic or
  apply patch, or a last operation of a JSON patch — under the same resourceVersion
  precondition as the rest of the write, so it is never half applied. For server-side apply
  the annotation becomes part of the applier's configuration; every later apply through a
  slice carries it again, so the applier never drops it by omission.

An object *leaving* a slice (the slice holds it, its labels no longer match) shows there as
being deleted; through that slice the writes still allowed are a PATCH of its ``status``
(:func:`vwserver.proxy.write_plan.plan_status_patch`: a status write changes nothing the
membership or the holds read) and the release of the slice's own finalizers
(:func:`serve_leaving`). The client's write is first run upstream as a dry run under
the proxy's precondition; if its result differs from the stored object only by removing
finalizers the slice holds, the proxy writes exactly that removal (and the annotation) as its
own conditional JSON patch. Anything else is 409 Conflict: the object is leaving the slice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec
from aiohttp import web

from vwserver.errors import Invalid, LeavingSlice
from vwserver.holds import (
    HOLDS_ANNOTATION,
    PROXY_ANNOTATIONS,
    RELEASE_ANNOTATION,
    WritePlan,
    annotation_pointer,
    as_leaving,
    is_holder_label,
    label_pointer,
    plan_write,
    releasable,
)
from vwserver.k8s.types import ObjectHead
from vwserver.proxy.context import ProxyRequest, WriteTarget
from vwserver.proxy.filtering import decode_head
from vwserver.proxy.responses import read_body, response_headers

JSON: Final = "application/json"
JSON_PATCH: Final = "application/json-patch+json"
APPLY_PATCH: Final = "application/apply-patch+yaml"

# Members of a stored object that a write may change without changing what the object *is*:
# the version, field ownership and the finalizers (and our own annotation).
_BOOKKEEPING: Final = ("resourceVersion", "managedFields", "finalizers", "generation")
_encode: Final = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class Stored:
    """The stored object as the proxy checked it: its decoded head and its bytes."""

    head: ObjectHead
    body: bytes

    @property
    def metadata(self) -> Any:
        return self.head.metadata


def _written_only_by_vwserver(ctx: WriteTarget, message: str, fields: list[str]) -> Invalid:
    """The 422 for a write through a slice that sets or changes what only vwserver writes."""
    return Invalid(
        message,
        details={
            "name": ctx.api.name,
            "causes": [
                {
                    "reason": "FieldValueForbidden",
                    "message": "written only by vwserver",
                    "field": field,
                }
                for field in fields
            ],
        },
    )


def _annotations_written(ctx: WriteTarget) -> Invalid:
    keys = ", ".join(sorted(PROXY_ANNOTATIONS))
    return _written_only_by_vwserver(
        ctx,
        f"metadata.annotations: {keys} are written only by vwserver; "
        "a write through a slice cannot set or change them",
        [f"metadata.annotations[{key}]" for key in sorted(PROXY_ANNOTATIONS)],
    )


def _holder_labels_written(ctx: WriteTarget, keys: list[str]) -> Invalid:
    return _written_only_by_vwserver(
        ctx,
        "metadata.labels: the holder labels (holder.sync.edge-connect.eu/…) are written only "
        "by vwserver; a write through a slice cannot set or change them",
        [f"metadata.labels[{key}]" for key in sorted(keys)],
    )


def _holder_only(labels: Any) -> dict[str, Any]:
    return (
        {k: v for k, v in labels.items() if is_holder_label(k)} if isinstance(labels, dict) else {}
    )


def _set_labels(meta: dict[str, Any], changes: Mapping[str, str | None]) -> None:
    """``meta``'s labels with the planned holder-label changes made (None: removed)."""
    if not changes:
        return
    labels = meta.get("labels")
    labels = dict(labels) if isinstance(labels, dict) else {}
    for key, value in changes.items():
        if value is None:
            labels.pop(key, None)
        else:
            labels[key] = value
    meta["labels"] = labels


def _label_ops(changes: Mapping[str, str | None], *, has_labels: bool) -> list[dict[str, Any]]:
    """JSON-patch operations making the planned holder-label changes, on an object that has
    (``has_labels``) a labels map or not."""
    if not changes:
        return []
    if not has_labels:
        added = {k: v for k, v in changes.items() if v is not None}
        return [{"op": "add", "path": "/metadata/labels", "value": added}] if added else []
    return [
        {"op": "remove", "path": label_pointer(k)}
        if v is None
        else {"op": "add", "path": label_pointer(k), "value": v}
        for k, v in changes.items()
    ]


def _finalizers(meta: dict[str, Any]) -> list[str]:
    value = meta.get("finalizers")
    return [f for f in value if isinstance(f, str)] if isinstance(value, list) else []


def _labels(meta: dict[str, Any]) -> dict[str, str] | None:
    value = meta.get("labels")
    return value if isinstance(value, dict) else None


def _set_annotation(meta: dict[str, Any], key: str, value: str | None) -> None:
    annotations = meta.get("annotations")
    if not isinstance(annotations, dict):
        annotations = {}
    annotations = dict(annotations)
    if value is None:
        annotations.pop(key, None)
    else:
        annotations[key] = value
    meta["annotations"] = annotations


# --- create and update ------------------------------------------------------------------------


def prepare_create(ctx: WriteTarget, body: dict[str, Any]) -> None:
    """A create's body with the holds of the finalizers it adds; refuses the proxy's
    annotations in it."""
    meta = body.get("metadata")
    if not isinstance(meta, dict):
        return
    annotations = meta.get("annotations")
    if isinstance(annotations, dict) and PROXY_ANNOTATIONS.intersection(annotations):
        raise _annotations_written(ctx)
    if forged := _holder_only(meta.get("labels")):
        raise _holder_labels_written(ctx, list(forged))
    plan = plan_write(
        ctx.member,
        stored_labels=None,
        stored_annotations=None,
        stored_finalizers=None,
        result_labels=_labels(meta),
        result_finalizers=_finalizers(meta),
        record=ctx.records_holds,
    )
    if plan.annotation is not None:
        _set_annotation(meta, HOLDS_ANNOTATION, plan.annotation)
    _set_labels(meta, plan.labels)


def prepare_update(ctx: WriteTarget, body: dict[str, Any], stored: Stored) -> dict[str, Any]:
    """An update's body with the proxy's annotations as they must be: the holds after this
    write, the release annotation as stored (whatever the client sent for either)."""
    meta = body.get("metadata")
    meta = dict(meta) if isinstance(meta, dict) else {}
    stored_meta = stored.metadata
    plan = plan_write(
        ctx.member,
        stored_labels=stored_meta.labels,
        stored_annotations=stored_meta.annotations,
        stored_finalizers=stored_meta.finalizers,
        result_labels=_labels(meta),
        result_finalizers=_finalizers(meta),
        record=ctx.records_holds,
    )
    _set_annotation(meta, HOLDS_ANNOTATION, plan.annotation)
    _set_labels(meta, plan.labels)  # the holder labels as they must be, whatever was sent
    release = (stored_meta.annotations or {}).get(RELEASE_ANNOTATION)
    _set_annotation(meta, RELEASE_ANNOTATION, release)
    if not meta["annotations"]:
        meta.pop("annotations")
    return {**body, "metadata": meta}


# --- patches ----------------------------------------------------------------------------------


def plan_patch(ctx: WriteTarget, stored: Stored | None, result: bytes) -> WritePlan:
    """The holds after a patch whose dry-run result is ``result`` (``stored`` None: an apply
    that creates the object); refuses a patch that would itself change the proxy's
    annotations or remove another slice's finalizer."""
    after = decode_head(result).metadata
    before = stored.metadata if stored is not None else None
    stored_annotations = (before.annotations if before is not None else None) or {}
    result_annotations = after.annotations or {}
    for key in PROXY_ANNOTATIONS:
        if stored_annotations.get(key) != result_annotations.get(key):
            raise _annotations_written(ctx)
    stored_holders = _holder_only(before.labels if before is not None else None)
    result_holders = _holder_only(after.labels)
    if stored_holders != result_holders:
        changed = set(stored_holders.items()) ^ set(result_holders.items())
        raise _holder_labels_written(ctx, list({k for k, _ in changed}))
    return plan_write(
        ctx.member,
        stored_labels=before.labels if before is not None else None,
        stored_annotations=stored_annotations,
        stored_finalizers=before.finalizers if before is not None else None,
        result_labels=after.labels,
        result_finalizers=after.finalizers,
        record=ctx.records_holds,
    )


def keep_holds(apply: dict[str, Any] | list[Any], stored: Stored) -> dict[str, Any] | list[Any]:
    """An apply configuration that states the stored holds annotation as it is (unless the
    client states it itself). An applier that configured the annotation before (through a
    slice, :func:`with_holds`) owns it, and an apply that leaves out a field its manager owns
    removes it: the dry run would then show the holds gone."""
    value = (stored.metadata.annotations or {}).get(HOLDS_ANNOTATION)
    holders = _holder_only(stored.metadata.labels)
    if (value is None and not holders) or not isinstance(apply, dict):
        return apply
    meta = apply.get("metadata")
    meta = dict(meta) if isinstance(meta, dict) else {}
    if value is not None:
        annotations = meta.get("annotations")
        annotations = dict(annotations) if isinstance(annotations, dict) else {}
        annotations.setdefault(HOLDS_ANNOTATION, value)
        meta["annotations"] = annotations
    if holders:  # the holder labels likewise
        labels = meta.get("labels")
        labels = dict(labels) if isinstance(labels, dict) else {}
        for key, label in holders.items():
            labels.setdefault(key, label)
        meta["labels"] = labels
    return {**apply, "metadata": meta}


def with_holds(
    patch: dict[str, Any] | list[Any], plan: WritePlan, *, content_type: str, result: bytes
) -> dict[str, Any] | list[Any]:
    """``patch`` (already conditional on the checked resourceVersion) that also writes the
    planned holds annotation."""
    if not plan.changes:
        return patch
    if isinstance(patch, list):  # JSON patch: more operations, after the client's
        result_meta = decode_head(result).metadata
        ops = list(patch)
        if not plan.changed:
            pass
        elif plan.annotation is None:
            ops.append({"op": "remove", "path": annotation_pointer(HOLDS_ANNOTATION)})
        elif result_meta.annotations is None:
            value: Any = {HOLDS_ANNOTATION: plan.annotation}
            ops.append({"op": "add", "path": "/metadata/annotations", "value": value})
        else:
            path = annotation_pointer(HOLDS_ANNOTATION)
            ops.append({"op": "add", "path": path, "value": plan.annotation})
        return ops + _label_ops(plan.labels, has_labels=result_meta.labels is not None)
    meta = patch.get("metadata")
    meta = dict(meta) if isinstance(meta, dict) else {}
    if plan.changed:
        annotations = meta.get("annotations")
        annotations = dict(annotations) if isinstance(annotations, dict) else {}
        if plan.annotation is None and content_type == APPLY_PATCH:
            # An apply removes what its manager no longer configures: leaving it out drops ours
            # when this manager alone set it (an entry left behind holds nothing: holds count
            # only finalizers still on the object).
            annotations.pop(HOLDS_ANNOTATION, None)
        else:
            # In a merge or strategic merge patch, null deletes the member.
            annotations[HOLDS_ANNOTATION] = plan.annotation
        meta["annotations"] = annotations
    if plan.labels:
        labels = meta.get("labels")
        labels = dict(labels) if isinstance(labels, dict) else {}
        for key, label in plan.labels.items():
            if label is None and content_type == APPLY_PATCH:
                labels.pop(key, None)  # as the annotation: left out of the configuration
            else:
                labels[key] = label  # null deletes it in a merge patch
        meta["labels"] = labels
    return {**patch, "metadata": meta}


# --- an object leaving the slice --------------------------------------------------------------


def leaving_refusal(ctx: WriteTarget, stored: Stored) -> LeavingSlice:
    member = ctx.member
    return LeavingSlice(
        f'{ctx.api.resource} "{ctx.api.name}" is leaving the slice {member.id} (its labels '
        f"stopped satisfying {member.selector.render()!r}; a leave, once seen, completes): "
        "through this slice only the slice's own finalizers may still be removed",
        details={"name": ctx.api.name, "group": ctx.api.group, "kind": ctx.api.resource},
    )


def _normalized(doc: Any) -> Any:
    if not isinstance(doc, dict):
        return doc
    meta = doc.get("metadata")
    if isinstance(meta, dict):
        meta = {k: v for k, v in meta.items() if k not in _BOOKKEEPING}
        annotations = meta.get("annotations")
        if isinstance(annotations, dict):
            annotations = {k: v for k, v in annotations.items() if k != HOLDS_ANNOTATION}
            meta["annotations"] = annotations or None
        if not meta.get("annotations"):
            meta.pop("annotations", None)
        labels = meta.get("labels")
        if isinstance(labels, dict):
            meta["labels"] = {k: v for k, v in labels.items() if not is_holder_label(k)} or None
        if not meta.get("labels"):
            meta.pop("labels", None)
        doc = {**doc, "metadata": meta}
    return doc


def release_patch(ctx: ProxyRequest, stored: Stored, result: bytes) -> list[dict[str, Any]]:
    """The proxy's own JSON patch for a release: ``result`` (a dry run of the client's write)
    must differ from the stored object only by removing finalizers the slice holds."""
    before: Any = msgspec.json.decode(stored.body)
    after: Any = msgspec.json.decode(result)
    meta_after = after.get("metadata") if isinstance(after, dict) else None
    if not isinstance(meta_after, dict):
        raise leaving_refusal(ctx, stored)
    stored_meta = stored.metadata
    result_finalizers = _finalizers(meta_after)
    if _normalized(before) != _normalized(after) or not releasable(
        ctx.member,
        stored_finalizers=stored_meta.finalizers,
        result_finalizers=result_finalizers,
        annotations=stored_meta.annotations,
    ):
        raise leaving_refusal(ctx, stored)
    plan = plan_write(
        ctx.member,
        stored_labels=stored_meta.labels,
        stored_annotations=stored_meta.annotations,
        stored_finalizers=stored_meta.finalizers,
        result_labels=stored_meta.labels,  # a release changes nothing but the finalizers
        result_finalizers=result_finalizers,
        record=False,
    )
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": stored_meta.resourceVersion},
        {"op": "replace", "path": "/metadata/finalizers", "value": result_finalizers},
    ]
    if plan.annotation is None:
        ops.append({"op": "remove", "path": annotation_pointer(HOLDS_ANNOTATION)})
    else:
        ops.append(
            {
                "op": "replace",
                "path": annotation_pointer(HOLDS_ANNOTATION),
                "value": plan.annotation,
            }
        )
    return ops + _label_ops(plan.labels, has_labels=stored_meta.labels is not None)


async def serve_leaving(
    ctx: ProxyRequest,
    stored: Stored,
    since: str,
    *,
    method: str,
    content_type: str,
    data: bytes,
    client_dry_run: bool,
) -> web.StreamResponse:
    """A write through a slice to an object leaving it: a release of the slice's own
    finalizers (written by the proxy), or 409."""
    if ctx.api.subresource or method not in ("PUT", "PATCH"):
        raise leaving_refusal(ctx, stored)
    query = [*ctx.options.items]
    if not client_dry_run:
        query.append(("dryRun", "All"))
    async with ctx.upstream.request(
        method,
        ctx.upstream_url,
        query=query,
        headers=ctx.upstream_headers(content_type=content_type),
        data=data,
    ) as up:
        status = up.status
        body = await read_body(up)
        headers = response_headers(up)
    ctx.check_answer(status, body, written=False)  # the dry run's result
    if status not in (200, 201):
        if status == 409:
            raise leaving_refusal(ctx, stored)
        return web.Response(status=status, body=body, headers=headers)
    ops = release_patch(ctx, stored, body)
    if client_dry_run:
        return web.Response(status=status, body=as_leaving(body, since), headers=headers)
    async with ctx.upstream.request(
        "PATCH",
        ctx.upstream_url,
        query=[(k, v) for k, v in ctx.options.items if k in ("fieldManager", "fieldValidation")],
        headers=ctx.upstream_headers(content_type=JSON_PATCH),
        data=_encode(ops),
    ) as up:
        status = up.status
        body = await read_body(up)
        headers = response_headers(up)
    ctx.check_answer(status, body)
    if status == 200:
        body = as_leaving(body, since)
    elif status == 422:
        # The proxy's test of the resourceVersion failed: the object changed since the check.
        raise leaving_refusal(ctx, stored)
    return web.Response(status=status, body=body, headers=headers)


def strip_leaving(body: dict[str, Any], stored: Stored) -> dict[str, Any]:
    """A client's update of a leaving object carries the deletion the slice showed it; the
    stored object has none (an update can never set one: the apiserver refuses a changed
    deletionTimestamp), so it is taken out before the dry run."""
    if stored.metadata.deletionTimestamp:
        return body
    meta = body.get("metadata")
    if not isinstance(meta, dict):
        return body
    shown = ("deletionTimestamp", "deletionGracePeriodSeconds")
    meta = {k: v for k, v in meta.items() if k not in shown}
    return {**body, "metadata": meta}
