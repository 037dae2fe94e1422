"""The guarded write as a pure plan: from the stored object, the client's request and the slice
(its membership and holds) to what is sent upstream, under which precondition — or the Status
the client gets instead.

The read path is built the same way (:mod:`vwserver.proxy.cache_plan`): every rule a write must
keep is a function of plain values here, testable as a table of cases
(``tests/unit/test_write_plan.py``); :mod:`vwserver.proxy.write_io` does the I/O — it reads the
stored object (from the shared watch cache when that has it, else from kcp), asks a plan, sends
the one write the plan returns, and on a conflict of the proxy's own precondition reads kcp
again and asks again. Hold rules stay in :mod:`vwserver.holds` (the proxy's half of them in
:mod:`vwserver.proxy.holding`); the plans call them.

A plan returns a :data:`Decision`:

* :class:`Send` — the body of the one conditional write: an update's object and a merge or
  apply patch carry ``metadata.resourceVersion`` (the apiserver answers 409 Conflict when it is
  not the stored one), a JSON patch starts with a ``test`` of ``/metadata/resourceVersion``
  (a failed test is the apiserver's 422), DeleteOptions carry ``preconditions.uid`` and
  ``preconditions.resourceVersion``. ``own_precondition`` says whether the client gave none
  of its own: only then is a conflict the proxy's, retried from a fresh read — a client's own
  precondition that fails gets kcp's 409 as it is.
* :data:`MISSING` — the object is missing or outside the slice: the same NotFound either way.
* :class:`Leaving` — the object is leaving the slice (:func:`vwserver.holds.leaving_since`):
  only the release of the slice's own finalizers is still possible
  (:func:`vwserver.proxy.holding.serve_leaving`).
* or it raises the :class:`~vwserver.errors.RequestError` the client gets.

The plans are only ever given an object that is in the slice (or None): the read that decides
"missing" or "outside" is the executor's, the same for both (no existence oracle).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from vwserver.errors import BadRequest, Conflict, Invalid
from vwserver.holds import (
    PROXY_ANNOTATIONS,
    WritePlan,
    hidden_by_relabel,
    is_holder_label,
    leaving_since,
    sees,
)
from vwserver.proxy import holding, patches
from vwserver.proxy.context import WriteTarget
from vwserver.proxy.filtering import UndecodableError, decode_head
from vwserver.proxy.holding import Stored
from vwserver.selector import Requirement

JSON_PATCH: Final = "application/json-patch+json"
MERGE_PATCH: Final = "application/merge-patch+json"
STRATEGIC_PATCH: Final = "application/strategic-merge-patch+json"
APPLY_PATCH: Final = "application/apply-patch+yaml"

RV_POINTER: Final = "/metadata/resourceVersion"
# Patch types whose result the proxy computes itself (main resource: no dry run).
LOCAL_PATCHES: Final = frozenset({MERGE_PATCH, JSON_PATCH})

_encode: Final = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class Send:
    """The one write to send: ``body`` (an object, a patch, DeleteOptions) conditional on the
    stored object the plan was given."""

    body: dict[str, Any] | list[Any]
    own_precondition: bool
    """The precondition is the proxy's alone (the client sent none): when it fails the object
    changed since it was read (or the cache was behind) and the write is planned again from a
    fresh read; the client never sees a conflict it did not ask for."""
    leaving_since: str | None = None
    """The object is leaving the slice (since then; ``""``: not recorded yet) and this write
    may still be made: its answer is shown as the slice sees the object, being deleted."""


@dataclass(frozen=True, slots=True)
class Leaving:
    """The object is leaving the slice since ``since`` (``""``: not recorded yet)."""

    since: str


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()
"""The object is missing (or outside the slice: the executor cannot tell them apart either)."""

Decision = Send | Leaving | _Missing


# --- the plans -------------------------------------------------------------------------------


def plan_update(target: WriteTarget, body: dict[str, Any], stored: Stored | None) -> Decision:
    """A PUT of ``body`` (the main resource or a subresource) over ``stored``.

    Main resource: the labels must keep the object in the slice (422 — also for a missing
    object, so that the answer says nothing about whether it exists, unless it exists and is
    leaving, where the update may release a finalizer); the holds are what this write makes
    them (:func:`vwserver.proxy.holding.prepare_update`), and the result must stay visible to
    the slice (:func:`check_seen_after`). A subresource (``status``) cannot change metadata
    (kcp's status strategy keeps the stored object's, see :func:`plan_status_patch`)."""
    refused: Invalid | None = None
    if not target.api.subresource:
        try:
            check_stays(labels_of(body), target)
        except Invalid as e:
            refused = e
    if stored is None:
        if refused is not None:
            raise refused
        return MISSING
    since = _leaving(target, stored)
    if since is not None:
        return Leaving(since)
    if refused is not None:
        raise refused
    send = body
    if not target.api.subresource:
        send = holding.prepare_update(target, body, stored)
        check_seen_after(target, send, stored)
    return Send(with_resource_version(send, stored, target), own_precondition=not _given_rv(body))


def plan_status_patch(
    target: WriteTarget,
    patch: dict[str, Any] | list[Any],
    stored: Stored | None,
    *,
    content_type: str,
) -> Decision:
    """A patch of a subresource (``status``), of any patch type: sent as it is, conditional on
    the checked resourceVersion, without a dry run.

    Verified against kcp v0.32 (``tests/e2e/test_status_subresource_kcp.py``): a write to a
    custom resource's ``status`` subresource — PUT, merge, JSON, and apply patch alike — keeps
    everything of the stored object but ``status`` (and ``managedFields``): labels,
    annotations, finalizers, ``deletionTimestamp`` and ``spec`` it sends are ignored
    (apiextensions' ``statusStrategy.PrepareForUpdate`` copies the old object). So the result's
    membership is the stored object's; the precondition is still needed, because the object
    could leave the slice between the check and the write.

    An object *leaving* the slice takes status writes too (answered as being deleted): a
    status write changes nothing the membership or the holds read, the slice that holds the
    object is the only one that sees it until it lets go, and its controller must be able to
    say what its cleanup did before it releases its finalizer — a syncer's ``Synced=True``
    would otherwise stay on an object whose copy is gone."""
    if stored is None:
        return MISSING
    since = _leaving(target, stored)
    if isinstance(patch, list):
        return Send(
            json_patch_precondition(patch, stored), own_precondition=True, leaving_since=since
        )
    return Send(
        with_resource_version(patch, stored, target),
        own_precondition=not _given_rv(patch),
        leaving_since=since,
    )


def plan_delete(target: WriteTarget, options: dict[str, Any], stored: Stored | None) -> Decision:
    """A DELETE with ``options`` (DeleteOptions) of ``stored``: conditional on its uid and
    resourceVersion (:func:`with_preconditions`). An object leaving the slice cannot be
    deleted through it (the executor answers :class:`Leaving` with the refusal)."""
    if stored is None:
        return MISSING
    since = _leaving(target, stored)
    if since is not None:
        return Leaving(since)
    given = options.get("preconditions") or {}
    return Send(
        with_preconditions(options, stored, target),
        own_precondition=not given.get("resourceVersion"),
    )


def plan_patch(
    target: WriteTarget,
    patch: dict[str, Any] | list[Any],
    stored: Stored | None,
    *,
    content_type: str,
    field_validation: str = "Warn",
) -> Decision:
    """A merge or JSON patch of the main resource, without a dry run: the proxy applies it to
    ``stored`` itself (:mod:`vwserver.proxy.patches` reproduces kcp's results and errors — a
    patch kcp would refuse is refused with kcp's Status); the result must stay in the slice and
    visible to it (:func:`check_result`), its holds are what this write makes them
    (:func:`vwserver.proxy.holding.plan_patch`: no client writes the proxy's annotations, no
    slice removes a finalizer another holds while it leaves), and the client's patch goes out
    as it is — with the holds annotation, conditional on the checked resourceVersion — so kcp
    computes the stored result itself, from exactly the object checked."""
    if stored is None:
        return MISSING
    since = _leaving(target, stored)
    if since is not None:
        return Leaving(since)
    document = msgspec.json.decode(stored.body)
    if isinstance(patch, list):
        patched = patches.apply_json_patch(document, patch, field_validation=field_validation)
    else:
        patched = patches.apply_merge_patch(document, patch, field_validation=field_validation)
    result = _encode(patched)
    if isinstance(patch, list):
        send: dict[str, Any] | list[Any] = json_patch_precondition(patch, stored)
        own = True
    else:
        send, own = with_resource_version(patch, stored, target), not _given_rv(patch)
    check_result(result, target, stored)
    holds = holding.plan_patch(target, stored, result)
    send = holding.with_holds(send, holds, content_type=content_type, result=result)
    return Send(send, own_precondition=own)


def apply_result_decided(
    target: WriteTarget, apply: dict[str, Any] | list[Any], stored: Stored
) -> bool:
    """Whether a server-side apply of ``apply`` (already labelled for the slice, conditional
    on ``stored``'s resourceVersion) keeps ``stored`` in the slice with its holds unchanged
    *whatever the field ownership decides* — then it needs no dry run: the one conditional
    write is sent as it is.

    What an apply does to metadata, without mutating admission (the caller's condition): every
    label, annotation and finalizer the configuration states is set to its value; of the
    stored ones it does not state, those its field manager alone owned are removed and the rest
    kept. kcp's answer is therefore between two bounds — the configuration's labels, and the
    stored labels overridden by them — and each selector requirement names one key whose
    value, when present, is known: a requirement that both bounds satisfy is satisfied by every
    result. The holds stay out of it: no finalizer stored or configured (the result has none,
    so no hold is added, removed or guarded), no proxy annotation and no holder label stored
    or configured (the result has none either; a configured one is refused on the dry-run
    path). Anything else keeps the dry run, whose result the proxy checks."""
    if not isinstance(apply, dict):
        return False
    meta = apply.get("metadata")
    if not isinstance(meta, dict):
        return False
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    if (
        not isinstance(labels, dict)
        or not isinstance(annotations, dict)
        or meta.get("finalizers")
        or any(is_holder_label(k) for k in labels)
        or any(k in PROXY_ANNOTATIONS for k in annotations)
    ):
        return False
    before = stored.metadata
    stored_labels = before.labels or {}
    if (
        before.finalizers
        or any(is_holder_label(k) for k in stored_labels)
        or any(k in PROXY_ANNOTATIONS for k in before.annotations or {})
    ):
        return False
    selector = target.route.selector
    return selector.matches(labels) and selector.matches({**stored_labels, **labels})


def apply_write_query(query: Sequence[tuple[str, str]], holds: WritePlan) -> list[tuple[str, str]]:
    """The query of an apply's write after its dry run: the client's, but ``force=true`` when
    the write changes the proxy's bookkeeping (``holds``: the holds annotation, the holder
    labels; :func:`vwserver.proxy.holding.with_holds`).

    The dry run was this apply with the stored bookkeeping restated as it is
    (:func:`vwserver.proxy.holding.keep_holds`: the same values, which conflict with nobody),
    under the same resourceVersion precondition as the write: it showed that nothing the client
    configures conflicts with another field manager on exactly the object the write applies to.
    The write differs from it only in the bookkeeping, whose owner need not be this apply:
    kcp's virtual workspace records an apply's fields partly under its manager's ``Update``
    operation (kcp v0.32.3, ``tests/conformance/test_apply_differential_kcp.py``), so the same
    manager's next apply changing the holds conflicts with itself — 409 on
    ``.metadata.annotations.sync.edge-connect.eu/holds``, a conflict the client never made and
    kcp would not answer it directly. Forcing takes over the proxy's own fields and changes
    nothing else: the client's fields were shown free of conflicts."""
    if not holds.changes:
        return list(query)
    return [*((k, v) for k, v in query if k != "force"), ("force", "true")]


# --- the rules -------------------------------------------------------------------------------


def _leaving(target: WriteTarget, stored: Stored) -> str | None:
    meta = stored.metadata
    return leaving_since(
        target.member,
        labels=meta.labels,
        annotations=meta.annotations,
        finalizers=meta.finalizers,
    )


def _given_rv(body: dict[str, Any] | list[Any]) -> bool:
    meta = body.get("metadata") if isinstance(body, dict) else None
    return bool(isinstance(meta, dict) and meta.get("resourceVersion"))


def with_resource_version(
    body: dict[str, Any], stored: Stored, target: WriteTarget
) -> dict[str, Any]:
    """The object (or merge/apply patch) conditional on the checked resourceVersion; a
    client's own resourceVersion that differs is the client's 409."""
    meta = body.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise BadRequest("metadata must be an object")
    rv = stored.metadata.resourceVersion
    given = (meta or {}).get("resourceVersion")
    if given and given != rv:
        raise kept_changing(target)  # the apiserver's answer to a stale resourceVersion
    send = copy.copy(body)
    send["metadata"] = {**(meta or {}), "resourceVersion": rv}
    return send


def json_patch_precondition(patch: list[Any], stored: Stored) -> list[Any]:
    """A JSON patch conditional on the checked resourceVersion: a leading ``test`` operation
    (the client's own operations may only ``test`` it: :func:`vwserver.proxy.writes.
    check_json_patch`)."""
    rv = stored.metadata.resourceVersion
    return [{"op": "test", "path": RV_POINTER, "value": rv}, *patch]


def patch_precondition(
    patch: dict[str, Any] | list[Any], stored: Stored, target: WriteTarget
) -> dict[str, Any] | list[Any]:
    """The patch made conditional on the resourceVersion the proxy checked: a JSON patch's
    leading ``test``; a merge or apply patch's ``metadata.resourceVersion``, which the
    apiserver checks like an update's (409 Conflict when it differs)."""
    if isinstance(patch, list):
        return json_patch_precondition(patch, stored)
    return with_resource_version(patch, stored, target)


def with_preconditions(
    options: dict[str, Any], stored: Stored, target: WriteTarget
) -> dict[str, Any]:
    """DeleteOptions conditional on the checked uid and resourceVersion. The client's own
    preconditions (e.g. client-go's uid-only ones) must hold for that object, or it gets the
    apiserver's 409; the proxy's then imply them."""
    given = options.get("preconditions") or {}
    for what, key, value in (
        ("UID", "uid", stored.metadata.uid),
        ("ResourceVersion", "resourceVersion", stored.metadata.resourceVersion),
    ):
        if given.get(key) and given[key] != value:
            raise Conflict(
                f"Precondition failed: {what} in precondition: {given[key]}, "
                f"{what} in object meta: {value}",
                details=details(target),
            )
    send = dict(options)
    send["preconditions"] = {
        "uid": stored.metadata.uid,
        "resourceVersion": stored.metadata.resourceVersion,
    }
    return send


def check_result(body: bytes, target: WriteTarget, stored: Stored | None) -> None:
    """A patch's result (``body``: kcp's dry run, or the proxy's own application of a merge or
    JSON patch) must keep the object in the slice and visible to it."""
    try:
        meta = decode_head(body).metadata
    except UndecodableError as e:
        # The result's labels are not strings: kcp refuses such a patch with 422 when it
        # validates the object; say so rather than fail.
        raise Invalid(f"metadata.labels: the patched object's labels must be strings ({e})") from e
    check_stays(meta.labels, target)
    if target.member.claimed is not None:
        return  # no holds on claimed objects: the rules alone decide (checked above)
    if stored is None:  # an apply that creates: no other slice holds the object yet
        if not sees(
            target.member,
            labels=meta.labels,
            annotations=meta.annotations,
            finalizers=meta.finalizers,
        ):
            raise hidden_by_hold(target)
    elif hidden_by_relabel(
        target.member,
        stored_labels=stored.metadata.labels,
        labels=meta.labels,
        annotations=meta.annotations,
        finalizers=meta.finalizers,
    ):
        raise hidden_by_hold(target)


def check_seen_after(target: WriteTarget, body: dict[str, Any], stored: Stored) -> None:
    """An update's object must stay visible to the slice: its labels (checked before) and the
    holds of other slices, which a relabel can make leave the object (removing the slice's own
    last finalizer may hide it: :func:`vwserver.holds.hidden_by_relabel`)."""
    if target.member.claimed is not None:
        return  # no holds on claimed objects: check_stays decided
    meta = body.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    annotations = meta.get("annotations")
    finalizers = meta.get("finalizers")
    if hidden_by_relabel(
        target.member,
        stored_labels=stored.metadata.labels,
        labels=meta.get("labels"),
        annotations=annotations if isinstance(annotations, dict) else None,
        finalizers=finalizers if isinstance(finalizers, list) else None,
    ):
        raise hidden_by_hold(target)


def check_stays(labels: dict[str, str] | None, target: WriteTarget) -> None:
    """422 unless ``labels`` satisfy the slice's selector — for a claimed resource, unless a
    related-resource rule shows the object with them (:func:`check_claimed`)."""
    if target.member.claimed is not None:
        check_claimed(target, labels=labels, name=target.api.name)
        return
    route = target.route
    violations = route.selector.violations(labels)
    if violations:
        raise _invalid(
            target,
            violations,
            message=(
                f'{target.api.resource} "{target.api.name}": the change would move the object '
                f"out of the slice {route.cluster}/{route.name} (labels must satisfy "
                f"{route.selector.render()!r})"
            ),
        )


def check_claimed(target: WriteTarget, *, labels: Mapping[str, str] | None, name: str) -> None:
    """422 unless one of the slice's rules for the claimed resource shows the object ``name``
    of the request's namespace with ``labels`` (a selector rule by the labels, a
    ``referencedBy`` rule while a visible object names it): a write never makes a claimed
    object invisible, nor creates one the slice would not show. The message names the rules."""
    claimed = target.member.claimed
    assert claimed is not None
    key = (claimed.cluster, target.api.namespace, name)
    if name and claimed.rule_for(key, labels) is not None:
        return
    route = target.route
    what = f'{target.api.resource} "{name}"' if name else target.api.resource
    raise Invalid(
        f"{what}: the object would not be visible through the slice {route.cluster}/"
        f"{route.name}: {claimed.describe()}",
        details={
            **details(target),
            "causes": [
                {
                    "reason": "FieldValueInvalid",
                    "message": f"no rule of the slice shows the object ({claimed.describe()})",
                    "field": "metadata",
                }
            ],
        },
    )


def check_labels(labels: Any, *, deletions: bool = False) -> None:
    """Labels are a map of strings to strings (the apiserver refuses anything else when it
    decodes ObjectMeta); a merge patch may also delete a label with null. The proxy's selector
    checks need the same reading of them as kcp's."""
    if labels is None:
        return
    if not isinstance(labels, dict):
        raise BadRequest("metadata.labels must be an object of strings")
    for key, value in labels.items():
        if not isinstance(value, str) and not (deletions and value is None):
            raise BadRequest(f"metadata.labels[{key}]: the value must be a string")


def labels_of(body: dict[str, Any]) -> dict[str, str] | None:
    """An object's labels, checked to be strings (400 otherwise)."""
    meta = body.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    check_labels(labels)
    return labels


def hidden_by_hold(target: WriteTarget) -> Invalid:
    route = target.route
    return Invalid(
        f'{target.api.resource} "{target.api.name}": the change would move the object out of '
        "a slice that holds it (one of its finalizers was added through that slice), which "
        f"would hide it from the slice {route.cluster}/{route.name} until that slice lets go",
        details=details(target),
    )


def kept_changing(target: WriteTarget) -> Conflict:
    """The apiserver's 409 for a write whose resourceVersion is not the stored one."""
    return Conflict(
        f'Operation cannot be fulfilled on {_qualified(target)} "{target.api.name}": the object '
        "has been modified; please apply your changes to the latest version and try again",
        details=details(target),
    )


def details(target: WriteTarget) -> dict[str, object]:
    api = target.api
    return {"name": api.name, "group": api.group, "kind": api.resource}


def _qualified(target: WriteTarget) -> str:
    api = target.api
    return f"{api.resource}.{api.group}" if api.group else api.resource


def _invalid(target: WriteTarget, violations: list[Requirement], *, message: str) -> Invalid:
    # kubectl prints the causes rather than the message when there are any: say it there too.
    route = target.route
    out: dict[str, object] = {
        **details(target),
        "causes": [
            cause(
                r.key,
                f"must satisfy {r.render()}: the change would move the object out of "
                f"the slice {route.cluster}/{route.name}",
            )
            for r in violations
        ],
    }
    return Invalid(message, details=out)


def cause(key: str, message: str) -> dict[str, str]:
    return {"reason": "FieldValueInvalid", "message": message, "field": f"metadata.labels[{key}]"}
