"""What to do for one upstream object — pure: (upstream, downstream, what we saw) → actions.

The sync loop (:mod:`vwserver.syncer.sync_loop`) reads both caches, calls :func:`plan` and
executes the returned actions in order; everything that decides lives here, without I/O, so the
decision table below is tested case by case.

=============================  =================================================================
upstream object                actions
=============================  =================================================================
live                           add our finalizer (first, so no deletion can be missed); ensure
                               the namespace; server-side apply the downstream copy if the
                               intent changed or it drifted; status up (only if it changed),
                               with condition ``Synced=True``
live, downstream not ours      finalizer, then :class:`Blocked` (reported as ``Synced=False``)
live, over a size bound        :class:`TooLarge` only (``Synced=False``, ``ObjectTooLarge``)
live, another syncer's         :class:`Contested` only: no finalizer, no downstream write, no
finalizer first                status (see :func:`~vwserver.syncer.naming.finalizer_owner`)
deleting, our finalizer        delete downstream (ours only), wait until it is really gone
                               (a live GET), write ``Synced=False``/``Released`` in place of
                               the mirrored status, then remove our finalizer (also what an
                               object *leaving the slice* looks like through a holding slice)
deleting, no finalizer of us   delete a downstream copy of ours if one is left; nothing else
deleting, another's first      as above (our own leftovers go: deleting is no fight), but no
                               status write, and :class:`Contested`
gone from our view             delete the downstream copy of ours — after a DELETED event at
                               once; otherwise (sweep) only once every upstream cache is synced.
                               If the last state still held our finalizer and was not being
                               deleted, the object did not end: it *left the filtered view*
                               (relabelled), and the finalizer can no longer be removed through
                               the endpoint → :class:`Stuck` (see :func:`left_view_holding`)
=============================  =================================================================

Status up mirrors the downstream ``status`` minus the configured ``statusExclude`` paths, plus the
syncer's own ``Synced`` condition (``conditions`` is a map keyed by ``type``; our condition keeps
the ``lastTransitionTime`` stored *upstream* while its status stays the same). The write is a
JSON merge patch of exactly the differences (RFC 7386: ``null`` removes).

**Comparing with what is stored, not with what was sent.** A structural schema silently prunes
fields it does not know and fills in defaults: a write of ``status.conditions`` to a schema without
it succeeds, and the stored object lacks it — compared with what the syncer wants, the object never
looks done, and every reconcile writes again (the demo's Widget, whose status has only ``phase``,
was written at every reconcile). The answer to every write is the stored object, so the sync loop
learns from it (:func:`learn`) which fields each side's schema prunes or defaults, per resource
(:class:`SchemaFacts`), and every comparison here leaves those fields out: pruned status fields are
no longer written, defaulted status fields no longer removed, and downstream fields that the copy
never has (dropped by a mutating webhook) or never has as ``null`` (defaulted) no longer count as
drift. (Downstream, a structural schema does not prune silently: server-side apply refuses a field
the schema does not declare — "field not declared in schema", observed on kcp v0.32.3 — which is a
sync error shown on the kcp object, not a loop.) A pruned field that later shows up on an object
(the schema was changed) is compared again (:meth:`SchemaFacts.confirmed_by`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec

from vwserver.clock import rfc3339
from vwserver.k8s import kcp
from vwserver.k8s.client import JSON
from vwserver.syncer.config import ResourceConfig
from vwserver.syncer.naming import (
    ANN_APPLIED,
    ObjectKey,
    downstream_namespace,
    field_manager,
    finalizer_owner,
    is_internal_key,
    link_annotations,
    link_labels,
    namespace_metadata,
    owned_by,
    source_key,
    user_metadata,
)

CONDITION_TYPE = "Synced"
_encode_sorted = msgspec.json.Encoder(order="sorted").encode
_decode = msgspec.json.decode

# Top-level fields that are not the object's content (everything else, e.g. spec or data, is).
_NOT_CONTENT = frozenset({"apiVersion", "kind", "metadata", "status"})


# --- what a server keeps of our writes ---------------------------------------------------------

#: A label or annotation: ``("labels" | "annotations", key)``.
MetadataKey = tuple[str, str]
_METADATA_MAPS = ("labels", "annotations")

#: A field: the keys from the object's root, e.g. ``("status", "conditions")``.
FieldPath = tuple[str, ...]
#: A path step into every item of a list: a schema prunes a field of a list's items in all of them.
ITEMS = "[]"


@dataclass(frozen=True)
class SchemaFacts:
    """What one resource's schema on one server does to fields the syncer writes, learned from
    the server's answers to those writes (:func:`learn`).

    ``pruned``: fields the syncer sent that the stored object lacks (a structural schema drops
    unknown fields without an error). ``defaulted``: fields the syncer removed (``null`` in a
    merge patch) that the stored object still has (the schema defaults them).
    """

    pruned: frozenset[FieldPath] = frozenset()
    defaulted: frozenset[FieldPath] = frozenset()

    def __or__(self, other: SchemaFacts) -> SchemaFacts:
        return SchemaFacts(self.pruned | other.pruned, self.defaulted | other.defaulted)

    def confirmed_by(self, obj: JSON) -> SchemaFacts:
        """These facts without pruned fields that ``obj`` has a value for: a server that stores
        the field on some object does not prune it (its schema changed, or the field was pruned
        only by a webhook for one object)."""
        kept = frozenset(p for p in self.pruned if _has(obj, p))
        return self if not kept else SchemaFacts(self.pruned - kept, self.defaulted)


def learn(sent: JSON, stored: JSON) -> SchemaFacts:
    """What the server did to ``sent`` (a merge patch or an applied object), judged from
    ``stored`` (its answer: the object as stored right after that write, so nobody else's write
    is mixed in). Lists are followed item by item only when both have the same length."""
    pruned: set[FieldPath] = set()
    defaulted: set[FieldPath] = set()
    _learn(sent, stored, (), pruned=pruned, defaulted=defaulted)
    return SchemaFacts(frozenset(pruned), frozenset(defaulted))


def _learn(
    sent: Any, stored: Any, path: FieldPath, *, pruned: set[FieldPath], defaulted: set[FieldPath]
) -> None:
    if isinstance(sent, dict) and isinstance(stored, dict):
        for key, value in sent.items():
            here = (*path, key)
            if value is None:
                if stored.get(key) is not None:
                    defaulted.add(here)
            elif key not in stored:
                pruned.add(here)
            else:
                _learn(value, stored[key], here, pruned=pruned, defaulted=defaulted)
    elif isinstance(sent, list) and isinstance(stored, list) and len(sent) == len(stored):
        for item, kept in zip(sent, stored, strict=True):
            _learn(item, kept, (*path, ITEMS), pruned=pruned, defaulted=defaulted)


def without(value: Any, paths: Iterable[FieldPath]) -> Any:
    """``value`` without the fields at ``paths`` (copied where changed, shared elsewhere)."""
    for path in paths:
        value = _without(value, path)
    return value


def _without(value: Any, path: FieldPath) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if head == ITEMS:
        return [_without(v, rest) for v in value] if isinstance(value, list) and rest else value
    if not isinstance(value, dict) or head not in value:
        return value
    copy = dict(value)
    if rest:
        copy[head] = _without(value[head], rest)
    else:
        del copy[head]
    return copy


def _has(value: Any, path: FieldPath) -> bool:
    if not path:
        return value is not None
    head, rest = path[0], path[1:]
    if head == ITEMS:
        return isinstance(value, list) and any(_has(v, rest) for v in value)
    return isinstance(value, dict) and head in value and _has(value[head], rest)


def _lookup(value: Any, path: FieldPath) -> Any:
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


@dataclass(frozen=True, kw_only=True)
class Context:
    syncer: str
    finalizer: str
    resource: ResourceConfig
    namespace_prefix: str = ""
    exclude_prefixes: tuple[str, ...] = ()
    #: Every upstream cache has completed a list: absence from it is evidence.
    may_delete_orphans: bool = False
    now: datetime
    #: What kcp's schema of the resource does to the status the syncer writes.
    upstream_schema: SchemaFacts = SchemaFacts()
    #: What the downstream schema does to the copies the syncer applies.
    downstream_schema: SchemaFacts = SchemaFacts()
    #: User metadata keys of this object the syncer stopped writing because another writer
    #: kept changing them back (see :class:`Apply`'s ``overwritten``).
    withheld: frozenset[MetadataKey] = frozenset()
    #: Why the upstream object is kept only as a stub (over a size bound), or None.
    too_large: str | None = None
    #: The copies of related objects the object's namespace needs
    #: (:mod:`~vwserver.syncer.related_plan`); None: the resource has no related objects.
    related: RelatedOutcome | None = None
    #: Nothing of this syncer's is left in the object's downstream namespace once this object
    #: is gone: no other primary, no copy of a related object (the namespace may go then).
    namespace_unused: bool = False


@dataclass(frozen=True)
class RelatedOutcome:
    """What :func:`vwserver.syncer.related_plan.plan` decided for the object's namespace:
    copy actions downstream (``down``) and in kcp (``up``), notes for the ``Synced`` message,
    ``problems`` as (reason, message), and whether copies nothing needs are still there
    (``pending``: a deletion waits for them)."""

    down: tuple[Any, ...] = ()
    up: tuple[Any, ...] = ()
    notes: tuple[str, ...] = ()
    problems: tuple[tuple[str, str], ...] = ()
    pending: bool = False


# --- actions ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SetFinalizers:
    """Replace the upstream object's finalizers, conditional on its resourceVersion."""

    finalizers: tuple[str, ...]
    resource_version: str
    #: Removing ours: first confirm with a live GET that the downstream copy is gone.
    verify_gone: tuple[str, str] | None = None


@dataclass(frozen=True)
class EnsureNamespace:
    name: str
    metadata: JSON


@dataclass(frozen=True)
class Apply:
    namespace: str
    name: str
    body: JSON
    #: User metadata keys someone else changed on the copy since the syncer's last apply (the
    #: intent is unchanged, the copy differs): writing them again is one round of a fight.
    overwritten: frozenset[MetadataKey] = frozenset()


@dataclass(frozen=True)
class Delete:
    namespace: str
    name: str
    uid: str
    #: Orphan sweep: first confirm with a live GET that the upstream object is really absent.
    confirm_upstream_absent: bool = False


@dataclass(frozen=True)
class PatchStatus:
    patch: JSON


@dataclass(frozen=True)
class RelatedCopies:
    """Apply and delete copies of related objects, in order
    (:class:`~vwserver.syncer.related_plan.CopyApply` / ``CopyDelete``)."""

    actions: tuple[Any, ...]


@dataclass(frozen=True)
class RelatedFailed:
    """A related object of this object cannot be copied (``Synced=False`` with ``reason``)."""

    reason: str
    message: str


@dataclass(frozen=True)
class CleanNamespace:
    """The downstream namespace holds nothing of this syncer's any more: delete it if it holds
    nothing at all (checked live, :mod:`vwserver.syncer.namespaces`)."""

    name: str


@dataclass(frozen=True)
class Wait:
    """Nothing more to do now; look again after ``seconds`` (e.g. downstream still deleting)."""

    seconds: float
    reason: str


@dataclass(frozen=True)
class Blocked:
    """The object cannot be synced until a human acts (reported, retried with backoff)."""

    message: str


@dataclass(frozen=True)
class TooLarge:
    """The object is over a size bound (:mod:`vwserver.syncer.memory`): not synced, reported as
    ``Synced=False``, reason ``ObjectTooLarge``."""

    message: str


@dataclass(frozen=True)
class Stuck:
    """The object left our view while holding our finalizer; only reporting is possible."""

    message: str


@dataclass(frozen=True)
class Contested:
    """Another syncer owns the object (its finalizer comes first): reported, nothing written."""

    owner: str
    message: str


Action = (
    SetFinalizers
    | EnsureNamespace
    | Apply
    | Delete
    | PatchStatus
    | RelatedCopies
    | RelatedFailed
    | CleanNamespace
    | Wait
    | Blocked
    | TooLarge
    | Stuck
    | Contested
)


# --- the decision -------------------------------------------------------------------------------


def plan(
    key: ObjectKey,
    upstream: JSON | None,
    downstream: JSON | None,
    *,
    tombstone: JSON | None,
    ctx: Context,
) -> list[Action]:
    """The actions for ``key``. ``tombstone``: the last state seen in a DELETED event."""
    namespace = downstream_namespace(key.cluster, key.namespace, prefix=ctx.namespace_prefix)
    ours = downstream is not None and owned_by(downstream, ctx.syncer)
    if ours and downstream is not None and source_key(downstream) != key:
        ours = False  # a namespace-name collision, refused by the namespace check
    if upstream is None:
        return _gone(key, downstream if ours else None, tombstone=tombstone, ctx=ctx)
    meta = upstream.get("metadata") or {}
    finalizers = tuple(meta.get("finalizers") or ())
    rv = str(meta.get("resourceVersion") or "")
    owner = finalizer_owner(finalizers, managed_fields=meta.get("managedFields"))
    contested: list[Action] = []
    if owner is not None and owner != ctx.syncer:
        contested.append(
            Contested(
                owner,
                f"{key} is owned by syncer {owner} (its finalizer comes first): syncer "
                f"{ctx.syncer} leaves it alone — two syncers see the same object, or {owner} "
                "no longer sees it and its finalizer is stale",
            )
        )
    if meta.get("deletionTimestamp"):
        deleting = _deleting(
            upstream,
            downstream if ours else None,
            finalizers=finalizers,
            rv=rv,
            ctx=ctx,
            report=not contested,
        )
        return [*contested, *deleting]
    if contested:
        return contested
    if ctx.too_large is not None:
        # only its metadata is held: nothing to copy; a copy made while it was smaller, and
        # our finalizer on it, stay until it is smaller again or deleted
        return [TooLarge(ctx.too_large)]

    actions: list[Action] = []
    if ctx.finalizer not in finalizers:
        actions.append(SetFinalizers((*finalizers, ctx.finalizer), rv))
    if downstream is not None and not ours:
        actions.append(
            Blocked(
                f"downstream object {namespace}/{key.name} exists and is not owned by "
                f"syncer {ctx.syncer}; delete or rename it"
            )
        )
        return actions
    if downstream is not None and _deleting_now(downstream):
        actions.append(Wait(2.0, "the downstream object is being deleted; re-creating after"))
        return actions
    actions.append(EnsureNamespace(namespace, namespace_metadata(key.cluster, key.namespace)))
    related = ctx.related
    if related is not None and related.down:
        # before the copy: the operator finds its password when it first sees the object
        actions.append(RelatedCopies(related.down))
    left = left_downstream(upstream, downstream, ctx=ctx)
    desired = desired_downstream(key, upstream, namespace=namespace, ctx=ctx, leave=left)
    if needs_apply(desired, downstream, schema=ctx.downstream_schema):
        actions.append(
            Apply(namespace, key.name, desired, overwritten=overwritten(desired, downstream))
        )
    if related is not None and related.up:
        actions.append(RelatedCopies(related.up))
    if related is not None and related.problems:
        reason = related.problems[0][0]
        actions.append(RelatedFailed(reason, "; ".join(m for _, m in related.problems)))
        return actions
    message = f"synced to {namespace}/{key.name} by syncer {ctx.syncer}"
    if left:
        message += "; not copied, written downstream by others: " + ", ".join(
            f"{kind[:-1]} {name}" for kind, name in sorted(left)[:_MAX_REPORTED]
        )
        if len(left) > _MAX_REPORTED:
            message += f" and {len(left) - _MAX_REPORTED} more"
    if related is not None and related.notes:
        message += "; " + "; ".join(related.notes[:_MAX_REPORTED])
    condition = new_condition(
        status=True,
        reason="Synced",
        message=message,
        generation=meta.get("generation"),
    )
    patch = status_patch(upstream, downstream, condition=condition, ctx=ctx)
    if patch is not None:
        actions.append(PatchStatus(patch))
    return actions


def _deleting(
    upstream: JSON,
    downstream: JSON | None,
    *,
    finalizers: tuple[str, ...],
    rv: str,
    ctx: Context,
    report: bool,
) -> list[Action]:
    """``report``: show progress as our condition (not on an object another syncer owns)."""
    namespace, name = _downstream_name(upstream, ctx)
    if ctx.finalizer not in finalizers:
        if downstream is not None and not _deleting_now(downstream):
            return [Delete(namespace, name, _uid(downstream))]
        return _related_cleanup(namespace, ctx)
    if downstream is None:
        # the copy is gone; its related copies go next (those nothing else needs), then the
        # finalizer: nothing of this object is left anywhere once kcp may remove it
        cleanup = _related_cleanup(namespace, ctx, clean=False)
        if ctx.related is not None and ctx.related.pending:
            condition = new_condition(
                status=False,
                reason="DeletingRelated",
                message="waiting for the copies of related objects to be deleted",
                generation=(upstream.get("metadata") or {}).get("generation"),
            )
            patch = condition_patch(upstream, condition, now=ctx.now, schema=ctx.upstream_schema)
            waiting: list[Action] = [*cleanup]
            if patch is not None and report:
                waiting.append(PatchStatus(patch))
            waiting.append(Wait(1.0, "waiting for the related copies to be gone"))
            return waiting
        rest = tuple(f for f in finalizers if f != ctx.finalizer)
        release = SetFinalizers(rest, rv, verify_gone=(namespace, name))
        patch = released_status_patch(upstream, namespace=namespace, name=name, ctx=ctx)
        released: list[Action] = [*cleanup]
        if patch is not None and report:
            released.append(PatchStatus(patch))
        released.append(release)
        if ctx.namespace_unused:
            released.append(CleanNamespace(namespace))
        return released
    actions: list[Action] = []
    if not _deleting_now(downstream):
        actions.append(Delete(namespace, name, _uid(downstream)))
    condition = new_condition(
        status=False,
        reason="DeletingDownstream",
        message=f"waiting for downstream {namespace}/{name} to be deleted",
        generation=(upstream.get("metadata") or {}).get("generation"),
    )
    patch = condition_patch(upstream, condition, now=ctx.now, schema=ctx.upstream_schema)
    if patch is not None and report:
        actions.append(PatchStatus(patch))
    actions.append(Wait(5.0, "waiting for the downstream object to be gone"))
    return actions


def released_status_patch(
    upstream: JSON, *, namespace: str, name: str, ctx: Context
) -> JSON | None:
    """The status an object keeps once the syncer has let go of it (its copy is gone, our
    finalizer goes next): no longer what the downstream copy reported — that copy is gone —
    only ``Synced=False``, reason ``Released``. Written before the finalizer goes, so that an
    object that *left the slice* (shown to us as being deleted; the holding slice still takes
    status writes) does not keep saying ``Synced=True`` / ``Running`` where nobody syncs it."""
    condition = new_condition(
        status=False,
        reason="Released",
        message=(
            f"the downstream copy {namespace}/{name} is deleted; syncer {ctx.syncer} no longer "
            "syncs this object"
        ),
        generation=(upstream.get("metadata") or {}).get("generation"),
    )
    current: JSON = upstream.get("status") or {}
    desired: JSON = {
        "conditions": with_condition((), condition, stored=current.get("conditions"), now=ctx.now)
    }
    return stored_status_patch(current, desired, schema=ctx.upstream_schema)


def _gone(
    key: ObjectKey,
    downstream: JSON | None,
    *,
    tombstone: JSON | None,
    ctx: Context,
) -> list[Action]:
    actions: list[Action] = []
    if downstream is not None and not _deleting_now(downstream):
        if tombstone is not None:
            actions.append(Delete(downstream_ns(downstream), key.name, _uid(downstream)))
        elif ctx.may_delete_orphans:
            actions.append(
                Delete(
                    downstream_ns(downstream),
                    key.name,
                    _uid(downstream),
                    confirm_upstream_absent=True,
                )
            )
    actions.extend(
        _related_cleanup(
            downstream_namespace(key.cluster, key.namespace, prefix=ctx.namespace_prefix),
            ctx,
            clean=downstream is None,
        )
    )
    if tombstone is not None and left_view_holding(tombstone, ctx.finalizer):
        actions.append(
            Stuck(
                f"{key} left the view of syncer {ctx.syncer} while carrying its finalizer "
                f"{ctx.finalizer}; the downstream copy is removed, but the finalizer cannot be "
                "removed through this endpoint (the object is no longer visible there)"
            )
        )
    return actions


def _related_cleanup(namespace: str, ctx: Context, *, clean: bool = True) -> list[Action]:
    """Where an object is gone (or going): the copy actions of its namespace (deletions of
    copies nothing needs), and, ``clean``, the namespace's removal when nothing of ours is
    left in it."""
    actions: list[Action] = []
    if ctx.related is not None and (ctx.related.down or ctx.related.up):
        actions.append(RelatedCopies(ctx.related.down + ctx.related.up))
    if clean and ctx.namespace_unused:
        actions.append(CleanNamespace(namespace))
    return actions


def left_view_holding(tombstone: JSON, finalizer: str) -> bool:
    """Whether the last state of an object that vanished from our view proves it still exists.

    The apiserver removes an object with finalizers only after ``deletionTimestamp`` is set, so
    a vanished object *without* one that still lists our finalizer did not end: it stopped
    matching the filter. (With ``deletionTimestamp`` it most likely ended: when the last
    finalizer is removed, kcp's DELETED event carries the stored state from *before* that
    update, our finalizer still listed — observed on kcp v0.32.3.)
    """
    meta = tombstone.get("metadata") or {}
    return not meta.get("deletionTimestamp") and finalizer in (meta.get("finalizers") or ())


# --- downstream desired state ----------------------------------------------------------------

#: Keys named in a ``Synced`` condition message at most.
_MAX_REPORTED = 5


def foreign_metadata(downstream: JSON | None, *, manager: str) -> frozenset[MetadataKey]:
    """The labels and annotations of the downstream copy that another field manager owns and
    ``manager`` (the syncer) does not, by the copy's ``managedFields``: the operator's (or an
    admin's) own keys. Server-side apply moves a field to whoever wrote it last (an update
    takes it over, a forced apply too), so a consumer key the operator also writes shows up
    here from the operator's first write on."""
    ours: set[MetadataKey] = set()
    theirs: set[MetadataKey] = set()
    for entry in (downstream or {}).get("metadata", {}).get("managedFields") or ():
        if entry.get("subresource"):
            continue
        fields = entry.get("fieldsV1")
        meta = fields.get("f:metadata") if isinstance(fields, dict) else None
        if not isinstance(meta, dict):
            continue
        owned = ours if entry.get("manager") == manager else theirs
        for kind in _METADATA_MAPS:
            for member in meta.get(f"f:{kind}") or {}:
                if member.startswith("f:"):
                    owned.add((kind, member[2:]))
    return frozenset(theirs - ours)


def left_downstream(
    upstream: JSON, downstream: JSON | None, *, ctx: Context
) -> frozenset[MetadataKey]:
    """The consumer's labels and annotations the syncer leaves to the downstream side: keys
    another manager owns on the copy (:func:`foreign_metadata`) and keys it stopped writing
    after they flipped back (``ctx.withheld``) — of those the consumer sets only."""
    meta = upstream.get("metadata") or {}
    wanted = {
        (kind, name)
        for kind in _METADATA_MAPS
        for name in user_metadata(meta.get(kind), extra_prefixes=ctx.exclude_prefixes)
    }
    manager = field_manager(ctx.syncer)
    return frozenset(wanted & (foreign_metadata(downstream, manager=manager) | ctx.withheld))


def overwritten(desired: JSON, downstream: JSON | None) -> frozenset[MetadataKey]:
    """User labels and annotations that ``desired`` sets and the copy has otherwise, while the
    copy carries the digest of this very intent (:data:`ANN_APPLIED`): the syncer applied them,
    someone else changed or removed them since."""
    if downstream is None:
        return frozenset()
    have = downstream.get("metadata") or {}
    want = desired["metadata"]
    if (have.get("annotations") or {}).get(ANN_APPLIED) != want["annotations"][ANN_APPLIED]:
        return frozenset()  # a new intent: its apply is no round of a fight
    out: set[MetadataKey] = set()
    for kind in _METADATA_MAPS:
        current = have.get(kind) or {}
        for name, value in want[kind].items():
            if not is_internal_key(name) and current.get(name) != value:
                out.add((kind, name))
    return frozenset(out)


def desired_downstream(
    key: ObjectKey,
    upstream: JSON,
    *,
    namespace: str,
    ctx: Context,
    leave: frozenset[MetadataKey] = frozenset(),
) -> JSON:
    """The object the syncer server-side applies downstream (its whole intent); ``leave``:
    user labels and annotations not to write (:func:`left_downstream`) — an apply that omits a
    key it does not own leaves the key as its owner wrote it."""
    meta = upstream.get("metadata") or {}
    uid = str(meta.get("uid") or "")
    target = ctx.resource.target
    labels = user_metadata(meta.get("labels"), extra_prefixes=ctx.exclude_prefixes)
    annotations = user_metadata(meta.get("annotations"), extra_prefixes=ctx.exclude_prefixes)
    for kind, name in leave:
        (labels if kind == "labels" else annotations).pop(name, None)
    labels.update(link_labels(key, uid=uid, syncer=ctx.syncer))
    annotations.update(link_annotations(key, uid=uid, syncer=ctx.syncer))
    body: JSON = {
        "apiVersion": f"{target.group}/{target.version}" if target.group else target.version,
        "kind": target.kind,
        "metadata": {
            "name": key.name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
    }
    for field, value in upstream.items():
        if field not in _NOT_CONTENT:
            body[field] = value
    digest = hashlib.sha256(_encode_sorted(body)).hexdigest()[:16]
    annotations[ANN_APPLIED] = digest
    return body


def needs_apply(
    desired: JSON, downstream: JSON | None, *, schema: SchemaFacts = SchemaFacts()
) -> bool:
    """Apply when there is no copy, the intent changed (covers removed fields), or it drifted.

    ``schema``: what the downstream schema is known to do to applied fields. A field it prunes
    is never on the copy, one it defaults never ``null``: neither is drift (the intent digest
    still covers them, so a changed value is applied once).
    """
    if downstream is None:
        return True
    applied = ((downstream.get("metadata") or {}).get("annotations") or {}).get(ANN_APPLIED)
    if applied != desired["metadata"]["annotations"][ANN_APPLIED]:
        return True
    return not contains(downstream, without(desired, schema.pruned | schema.defaulted))


def contains(actual: Any, wanted: Any) -> bool:
    """Whether ``actual`` has every field of ``wanted`` with the same value; fields the
    downstream API added (defaults, other managers) do not count as a difference, and a
    ``null`` wanted is satisfied by an absent field (the apiserver drops most nulls)."""
    if isinstance(wanted, dict):
        return isinstance(actual, dict) and all(
            contains(actual[k], v) if k in actual else v is None for k, v in wanted.items()
        )
    if isinstance(wanted, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(wanted)
            and all(contains(a, w) for a, w in zip(actual, wanted, strict=True))
        )
    return bool(actual == wanted)


def _downstream_name(upstream: JSON, ctx: Context) -> tuple[str, str]:
    meta = upstream.get("metadata") or {}
    cluster = kcp.logical_cluster(upstream)
    return (
        downstream_namespace(cluster, meta.get("namespace", ""), prefix=ctx.namespace_prefix),
        meta.get("name", ""),
    )


def downstream_ns(obj: JSON) -> str:
    return str((obj.get("metadata") or {}).get("namespace") or "")


def _uid(obj: JSON) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _deleting_now(obj: JSON) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


# --- status up ----------------------------------------------------------------------------------


def new_condition(*, status: bool, reason: str, message: str, generation: Any = None) -> JSON:
    condition: JSON = {
        "type": CONDITION_TYPE,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
    }
    if isinstance(generation, int):
        condition["observedGeneration"] = generation
    return condition


def with_condition(
    conditions: Sequence[JSON] | None,
    condition: JSON,
    *,
    stored: Sequence[JSON] | None,
    now: datetime,
) -> list[JSON]:
    """``conditions`` (e.g. mirrored from downstream) with ``condition`` in place of the one of
    its type, its ``lastTransitionTime`` kept from the condition ``stored`` upstream while its
    status is the same (the mirrored list never has ours: a new time on every reconcile would be
    a change on every reconcile)."""
    kind = condition["type"]
    ours = next(c for c in set_condition(stored, condition, now=now) if c.get("type") == kind)
    result = [c for c in conditions or () if c.get("type") != kind]
    result.append(ours)
    return result


def set_condition(
    conditions: Sequence[JSON] | None, condition: JSON, *, now: datetime
) -> list[JSON]:
    """``conditions`` with ``condition`` in place of the one of its type (meta.SetStatusCondition:
    ``lastTransitionTime`` changes only when the status does)."""
    result: list[JSON] = []
    placed = False
    for existing in conditions or ():
        if existing.get("type") != condition["type"]:
            result.append(existing)
            continue
        updated = dict(condition)
        if existing.get("status") == condition["status"] and existing.get("lastTransitionTime"):
            updated["lastTransitionTime"] = existing["lastTransitionTime"]
        else:
            updated["lastTransitionTime"] = rfc3339(now)
        result.append(updated)
        placed = True
    if not placed:
        result.append({**condition, "lastTransitionTime": rfc3339(now)})
    return result


def mirrored_status(downstream_status: JSON | None, exclude: Iterable[str]) -> JSON:
    """The downstream status without the excluded dotted paths (a deep copy)."""
    status: JSON = _decode(_encode_sorted(downstream_status or {}))
    for path in exclude:
        *parents, leaf = path.split(".")
        node: Any = status
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return status


def status_patch(
    upstream: JSON,
    downstream: JSON | None,
    *,
    condition: JSON,
    ctx: Context,
) -> JSON | None:
    """The merge patch ``{"status": ...}`` that makes the upstream status the mirrored downstream
    status plus ``condition``, as far as kcp's schema stores it (``ctx.upstream_schema``); None
    when nothing differs."""
    current: JSON = upstream.get("status") or {}
    if downstream is None:
        # Not created yet (or not seen yet): keep what is there, only the condition changes.
        desired = dict(current)
    else:
        desired = mirrored_status(downstream.get("status"), ctx.resource.status_exclude)
    desired["conditions"] = with_condition(
        desired.get("conditions"), condition, stored=current.get("conditions"), now=ctx.now
    )
    return stored_status_patch(current, desired, schema=ctx.upstream_schema)


def condition_patch(
    upstream: JSON, condition: JSON, *, now: datetime, schema: SchemaFacts = SchemaFacts()
) -> JSON | None:
    """A status merge patch that sets only ``condition``; None if it is already so, or if the
    schema does not store it (``status.conditions`` pruned)."""
    current: JSON = upstream.get("status") or {}
    desired = dict(current)
    desired["conditions"] = set_condition(current.get("conditions"), condition, now=now)
    return stored_status_patch(current, desired, schema=schema)


def stored_status_patch(current: JSON, desired: JSON, *, schema: SchemaFacts) -> JSON | None:
    """The merge patch ``{"status": ...}`` from the stored ``current`` status to ``desired``,
    for what the schema stores only: pruned fields are not written (``current`` cannot have
    them), defaulted fields are not removed (the server would put them back). None: nothing to
    write."""
    root: JSON = without({"status": desired}, schema.pruned)
    for path in schema.defaulted:
        if ITEMS in path or _has(root, path) or not _has({"status": current}, path):
            continue
        node = root
        for key in path[:-1]:
            child = node.get(key)
            node[key] = child = dict(child) if isinstance(child, dict) else {}
            node = child
        node[path[-1]] = _lookup({"status": current}, path)
    diff = merge_diff(current, root.get("status") or {})
    return None if diff is None else {"status": diff}


def merge_diff(current: JSON, desired: JSON) -> JSON | None:
    """The RFC 7386 merge patch turning ``current`` into ``desired``; None if they are equal."""
    patch: JSON = {}
    for k in current:
        if k not in desired:
            patch[k] = None
    for k, value in desired.items():
        if value is None:
            if current.get(k) is not None:
                patch[k] = None
            continue
        old = current.get(k)
        if isinstance(value, dict) and isinstance(old, dict):
            sub = merge_diff(old, value)
            if sub is not None:
                patch[k] = sub
        elif old != value:
            patch[k] = _without_nulls(value)
    return patch or None


def _without_nulls(value: Any) -> Any:
    # A merge patch cannot *set* null; a null inside a new value would mean "remove".
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value
