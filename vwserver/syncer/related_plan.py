"""Which copies of related objects one namespace needs — pure: primaries + related objects on
both sides → copies to apply and to delete.

Related objects are shared: two MongoDBs of a namespace may name the same password Secret, and
api-syncagent's users report what goes wrong when each primary claims it with a finalizer (the
finalizers collide, deletion hangs). So nothing here belongs to one primary, and related objects
carry no finalizer at all. The plan is **level-based, per namespace**: the copies a namespace
needs are the union of what its *live synced* primaries reference now; a copy of this syncer's
(its owner label, written by its field manager — :func:`owned_copy`) that nothing needs is
deleted; nothing else is ever deleted. The plan is made for the namespace of the primary being
synced, under a lock per namespace, every time one of its primaries or related objects changes.

Who counts (:func:`member`):

=========================================  ====================================================
primary                                    role
=========================================  ====================================================
kept only as a stub (over a size bound)    ``unknown``: its references are not known, so
                                           nothing is deleted in its namespace
live, ours (our claimed finalizer first,   ``syncs``: what it references is copied
or the one being synced now, unclaimed)
its downstream copy still exists (being    ``keeps``: what it or its copy references is not
deleted, or left the view, or contested)   deleted (the operator may still need the password
                                           while it cleans up), nothing new is copied
live, not claimed by anyone yet            ``keeps``
another syncer's, no copy of ours          not a member
=========================================  ====================================================

A ``syncs`` member's references are read from the *origin* side: the kcp object for origin
``kcp``, its downstream copy for origin ``downstream``. What keeps a copy is read from both (the
kcp object and its copy): while the downstream copy of a MongoDB still names the old password
Secret, the old Secret's copy stays, and it goes once the copy is updated.

Order, decided by :mod:`vwserver.syncer.sync_plan`: copies down are applied before the primary's
copy (the operator finds its password when it first sees the database), copies up right after
it; on deletion, the primary's finalizer is removed only once the copies nothing needs any more
are gone (:attr:`RelatedPlan.pending`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from vwserver.k8s.client import JSON
from vwserver.syncer.naming import (
    ANN_APPLIED,
    ANN_CLUSTER,
    ANN_NAMESPACE,
    ANN_SOURCE,
    ANN_SYNCER,
    ANN_UID,
    LABEL_CLUSTER,
    LABEL_RELATED,
    LABEL_SYNCER,
    ObjectKey,
    field_manager,
    finalizer_owner,
    user_metadata,
)
from vwserver.syncer.related_spec import RelatedSpec
from vwserver.syncer.sync_plan import (
    MetadataKey,
    RelatedOutcome,
    foreign_metadata,
    needs_apply,
    overwritten,
)

Role = Literal["syncs", "keeps", "unknown"]

_encode_sorted = msgspec.json.Encoder(order="sorted").encode
_NOT_CONTENT = frozenset({"apiVersion", "kind", "metadata", "status"})
#: Keys named in one note at most.
_MAX_REPORTED = 5
#: Fields of a Secret / ConfigMap whose keys ``keys`` selects.
_DATA_FIELDS = ("data", "stringData", "binaryData")


@dataclass(frozen=True, slots=True)
class Member:
    """A primary object of the namespace as the related plan sees it (:func:`member`)."""

    key: ObjectKey
    role: Role
    upstream: JSON | None = None
    downstream: JSON | None = None

    def intent(self, spec: RelatedSpec) -> JSON | None:
        """The object whose references are copied: the origin side's."""
        return self.upstream if spec.copies_down else self.downstream

    def origins(self) -> tuple[JSON, ...]:
        return tuple(o for o in (self.upstream, self.downstream) if o is not None)


def member(
    key: ObjectKey,
    upstream: JSON | None,
    downstream: JSON | None,
    *,
    syncer: str,
    current: ObjectKey | None,
    too_large: bool,
) -> Member | None:
    """The role of one primary (module docstring); ``downstream``: its copy if it is ours;
    ``current``: the primary being synced (unclaimed, it is claimed before anything is
    copied)."""
    if upstream is not None and too_large:
        return Member(key, "unknown")
    meta = (upstream or {}).get("metadata") or {}
    live = upstream is not None and not meta.get("deletionTimestamp")
    owner = finalizer_owner(meta.get("finalizers") or (), managed_fields=meta.get("managedFields"))
    if live and (owner == syncer or (owner is None and key == current)):
        return Member(key, "syncs", upstream, downstream)
    if downstream is not None or (live and owner is None):
        return Member(key, "keeps", upstream if live else None, downstream)
    return None


@dataclass(frozen=True, kw_only=True)
class Scope:
    """The namespace the plan is for, on both sides, and who makes it."""

    cluster: str
    namespace: str
    """The primaries' namespace in kcp (where copies up go)."""
    downstream_namespace: str
    """Its downstream namespace (where copies down go, and where sources of origin
    ``downstream`` are)."""
    syncer: str
    current: ObjectKey | None = None
    """The primary being synced: notes and problems are about what it references."""
    may_delete: bool = False
    """Every cache has listed: absence is evidence, copies nothing needs may go."""
    exclude_prefixes: tuple[str, ...] = ()
    withheld: Mapping[tuple[str, str], frozenset[MetadataKey]] = field(default_factory=dict)
    """Per copy in this namespace (related entry, copy name): the user labels/annotations the
    syncer stopped writing because another writer kept changing them back on the copy (the
    flip limit, as for primaries: :class:`CopyApply`'s ``overwritten``)."""


@dataclass(frozen=True, slots=True)
class Inputs:
    """What the caches hold for one related entry in the namespace: ``sources`` on the origin
    side (by name), which of them are kept only as stubs (``too_large``: name → why), and the
    objects the copies' reflector shows on the other side (by name; only :func:`owned_copy`
    ones count)."""

    sources: Mapping[str, JSON]
    copies: Mapping[str, JSON]
    too_large: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CopyApply:
    """Server-side apply ``body`` as ``namespace/name`` on the copy's side; ``create``: no copy
    of ours is known, so an existing object there is someone else's (check first)."""

    related: str
    down: bool
    namespace: str
    name: str
    body: JSON
    create: bool
    overwritten: frozenset[MetadataKey] = frozenset()
    """User metadata keys someone else changed on the copy since the syncer's last apply of
    this very intent: writing them again is one round of a fight (counted by the sync loop
    against its flip limit, :func:`~vwserver.syncer.sync_plan.overwritten`)."""


@dataclass(frozen=True, slots=True)
class CopyDelete:
    """Delete a copy of ours nothing needs (``uid`` precondition)."""

    related: str
    down: bool
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class Problem:
    """Why a related object of the current primary cannot be copied: shown as its
    ``Synced=False`` (``reason``: ``ObjectTooLarge``, ``NotOwned`` or ``Invalid``)."""

    reason: str
    message: str


CopyAction = CopyApply | CopyDelete


@dataclass(slots=True)
class RelatedPlan:
    down: list[CopyAction] = field(default_factory=list)
    """Copies in the downstream cluster (before the primary's copy is applied)."""
    up: list[CopyAction] = field(default_factory=list)
    """Copies in kcp (after it)."""
    notes: list[str] = field(default_factory=list)
    """For the current primary's ``Synced=True`` message (e.g. a Secret not there yet)."""
    problems: list[Problem] = field(default_factory=list)
    pending: bool = False
    """Copies nothing needs still exist (being deleted, or deletions not yet decided):
    the current primary's finalizer must wait."""
    down_copies: int = 0
    """Copies of ours that stay in the downstream namespace after this plan."""


def owned_copy(obj: Mapping[str, Any], *, syncer: str, label: str) -> bool:
    """Whether ``obj`` is this syncer's copy for the related entry ``label``: both labels say so
    and the syncer's own field manager wrote the owner label (``managedFields``) — a consumer
    who labels a Secret of its own so is not making it the syncer's (to delete)."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(LABEL_SYNCER) != syncer or labels.get(LABEL_RELATED) != label:
        return False
    manager = field_manager(syncer)
    for entry in meta.get("managedFields") or ():
        if entry.get("manager") != manager or entry.get("subresource"):
            continue
        fields = entry.get("fieldsV1")
        owned = ((fields.get("f:metadata") or {}) if isinstance(fields, dict) else {}).get(
            "f:labels"
        )
        if isinstance(owned, dict) and f"f:{LABEL_SYNCER}" in owned:
            return True
    return False


def is_syncer_copy(obj: Mapping[str, Any]) -> bool:
    """A syncer's copy (any syncer's owner label) is never a related object itself: copies
    never travel back."""
    return LABEL_SYNCER in ((obj.get("metadata") or {}).get("labels") or {})


def source_name(copy: Mapping[str, Any]) -> str:
    """The name of the object a copy copies (its :data:`ANN_SOURCE`)."""
    value = ((copy.get("metadata") or {}).get("annotations") or {}).get(ANN_SOURCE) or ""
    return str(value).rpartition("/")[2]


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str] | None:
    labels = (obj.get("metadata") or {}).get("labels")
    return labels if isinstance(labels, dict) else None


def _deleting(obj: Mapping[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def referenced(spec: RelatedSpec, obj: JSON | None, sources: Mapping[str, JSON]) -> set[str]:
    """The names of related objects ``obj`` references (a selector: every matching source)."""
    if obj is None:
        return set()
    names = spec.names(obj)
    if names is None:
        return {n for n, s in sources.items() if spec.matches(_labels(s))}
    return set(names)


def missing_sources(
    spec: RelatedSpec, primary: Member | None, sources: Mapping[str, JSON]
) -> frozenset[str]:
    """The related objects of origin ``kcp`` a new primary names that the cache does not hold
    yet: read live before its copy is created (:meth:`~vwserver.syncer.related_io.RelatedWatch.
    fetch`). A slice shows a Secret from the moment a visible object references it, so the
    Secret's ADDED on the syncer's watch can arrive just after the primary's own: without the
    read, the primary's copy would be created first and the operator would start without its
    password. Only for a primary this syncer syncs (:func:`member`: live, ours or unclaimed)
    that has no copy yet — once per new primary; selectors name nothing (their objects are not
    made visible by the primary)."""
    if not spec.copies_down or primary is None or primary.role != "syncs":
        return frozenset()
    if primary.downstream is not None:
        return frozenset()
    names = spec.names(primary.upstream)
    return frozenset() if names is None else frozenset(names - sources.keys())


def desired_copy(
    spec: RelatedSpec,
    source: JSON,
    *,
    name: str,
    scope: Scope,
    leave: frozenset[tuple[str, str]] = frozenset(),
) -> JSON:
    """The copy the syncer applies: the source's content (``keys`` of its data only), its user
    labels and annotations (not kcp's, not ``sync.edge-connect.eu/``, not excluded prefixes,
    not ``leave``: keys another writer owns on the copy), and the links back."""
    meta = source.get("metadata") or {}
    labels = user_metadata(meta.get("labels"), extra_prefixes=scope.exclude_prefixes)
    annotations = user_metadata(meta.get("annotations"), extra_prefixes=scope.exclude_prefixes)
    for kind, key in leave:
        (labels if kind == "labels" else annotations).pop(key, None)
    labels[LABEL_SYNCER] = scope.syncer
    labels[LABEL_RELATED] = spec.label
    if spec.copies_down:
        labels[LABEL_CLUSTER] = scope.cluster
    annotations.update(
        {
            ANN_CLUSTER: scope.cluster,
            ANN_NAMESPACE: scope.namespace,
            ANN_SOURCE: f"{meta.get('namespace', '')}/{meta.get('name', '')}",
            ANN_UID: _uid(source),
            ANN_SYNCER: scope.syncer,
        }
    )
    body: JSON = {
        "apiVersion": f"{spec.group}/{spec.version}" if spec.group else spec.version,
        "kind": spec.kind,
        "metadata": {
            "name": name,
            "namespace": scope.downstream_namespace if spec.copies_down else scope.namespace,
            "labels": labels,
            "annotations": annotations,
        },
    }
    for key, value in source.items():
        if key in _NOT_CONTENT:
            continue
        if spec.keys and key in _DATA_FIELDS and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k in spec.keys}
        body[key] = value
    annotations[ANN_APPLIED] = hashlib.sha256(_encode_sorted(body)).hexdigest()[:16]
    return body


def _left(
    source: JSON,
    copy: JSON | None,
    *,
    scope: Scope,
    withheld: frozenset[MetadataKey] = frozenset(),
) -> frozenset[MetadataKey]:
    """User labels/annotations of the source that another writer owns on the copy, or that the
    syncer stopped writing after they flipped back (``withheld``): left to the other side (the
    primaries' rule, :func:`~vwserver.syncer.sync_plan.left_downstream`)."""
    meta = source.get("metadata") or {}
    wanted = {
        (kind, k)
        for kind in ("labels", "annotations")
        for k in user_metadata(meta.get(kind), extra_prefixes=scope.exclude_prefixes)
    }
    foreign = (
        frozenset() if copy is None else foreign_metadata(copy, manager=field_manager(scope.syncer))
    )
    return frozenset(wanted & (foreign | withheld))


_NAMED = 5  # related objects named in one problem's message, at most


def _too_large(
    spec: RelatedSpec, names: list[str], *, where: str, reasons: Mapping[str, str]
) -> Problem:
    """One problem for the related objects over a bound that the current primary references:
    each by kind and name (a tenant reads this: names, never an address), the first one's
    reason."""
    named = ", ".join(f"{where}{n}" for n in names[:_NAMED])
    if len(names) > _NAMED:
        named += f" and {len(names) - _NAMED} more"
    verb = "is" if len(names) == 1 else "are"
    return Problem(
        "ObjectTooLarge",
        f"related {spec.name}: {spec.kind} {named} {verb} not copied: {reasons[names[0]]}",
    )


def plan_one(
    spec: RelatedSpec,
    inputs: Inputs,
    *,
    members: Sequence[Member],
    scope: Scope,
    out: RelatedPlan,
) -> None:
    """Add the actions, notes and problems of one related entry to ``out``."""
    down = spec.copies_down
    target_ns = scope.downstream_namespace if down else scope.namespace
    actions = out.down if down else out.up
    owned = {
        n: c
        for n, c in inputs.copies.items()
        if owned_copy(c, syncer=scope.syncer, label=spec.label)
    }
    wanted: set[str] = set()  # source names copied
    protected: set[str] = set()  # source names whose existing copy stays
    mine: set[str] = set()  # what the current primary references (for its notes/problems)
    unknown = False
    for m in members:
        if m.role == "unknown":
            unknown = True
            continue
        if m.role == "syncs":
            names = referenced(spec, m.intent(spec), inputs.sources)
            wanted |= names
            if m.key == scope.current:
                mine |= names
        for origin in m.origins():
            protected |= referenced(spec, origin, inputs.sources)
    where = f"{scope.namespace}/" if down else ""
    desired: dict[str, tuple[str, JSON]] = {}  # copy name → (source name, source)
    too_large: list[str] = []  # what the current primary references that is over a bound
    for name in sorted(wanted):
        source = inputs.sources.get(name)
        label = f"related {spec.name} {where}{name}"
        if source is None:
            if name in mine and down:
                out.notes.append(f"{label}: not found")
            continue
        if is_syncer_copy(source):
            if name in mine:
                out.problems.append(
                    Problem("Invalid", f"{label} carries {LABEL_SYNCER}: a copy is never copied")
                )
            continue
        if name in inputs.too_large:
            if name in mine:
                too_large.append(name)
            continue
        target = spec.target_name(source)
        if target is None:
            if name in mine:
                out.problems.append(
                    Problem("Invalid", f"{label}: targetName gives no valid object name")
                )
            continue
        if target in desired:
            if name in mine:
                out.problems.append(
                    Problem(
                        "Invalid",
                        f"{label}: its copy would be named {target}, as the copy of "
                        f"{desired[target][0]}",
                    )
                )
            continue
        desired[target] = (name, source)
    if too_large:
        out.problems.append(_too_large(spec, too_large, where=where, reasons=inputs.too_large))
    desired_sources = {name for name, _ in desired.values()}
    for target, (name, source) in sorted(desired.items()):
        copy = owned.get(target)
        if copy is not None and _deleting(copy):
            continue  # re-created once it is gone (its DELETED event brings the namespace back)
        withheld = scope.withheld.get((spec.name, target), frozenset())
        left = _left(source, copy, scope=scope, withheld=withheld)
        if left and name in mine:
            shown = ", ".join(f"{kind[:-1]} {key}" for kind, key in sorted(left)[:_MAX_REPORTED])
            more = f" and {len(left) - _MAX_REPORTED} more" if len(left) > _MAX_REPORTED else ""
            out.notes.append(
                f"related {spec.name} {where}{name}: not copied, written on its copy by others: "
                f"{shown}{more}"
            )
        body = desired_copy(spec, source, name=target, scope=scope, leave=left)
        if copy is None or needs_apply(body, copy):
            actions.append(
                CopyApply(
                    spec.name,
                    down,
                    target_ns,
                    target,
                    body,
                    copy is None,
                    overwritten=overwritten(body, copy),
                )
            )
    stays = len(desired)
    for target, copy in sorted(owned.items()):
        if target in desired:
            continue
        src = source_name(copy)
        if src in protected and src not in desired_sources:
            stays += 1
            continue
        if not scope.may_delete or unknown:
            stays += 1
            out.pending = out.pending or not scope.may_delete
            continue
        out.pending = True
        if not _deleting(copy):
            actions.append(CopyDelete(spec.name, down, target_ns, target, _uid(copy)))
    if down:
        out.down_copies += stays


def outcome(related: RelatedPlan) -> RelatedOutcome:
    """The plan as :mod:`~vwserver.syncer.sync_plan` places it among a primary's actions."""
    return RelatedOutcome(
        down=tuple(related.down),
        up=tuple(related.up),
        notes=tuple(related.notes),
        problems=tuple((p.reason, p.message) for p in related.problems),
        pending=related.pending,
    )


def plan(
    specs: Iterable[RelatedSpec],
    inputs: Mapping[str, Inputs],
    *,
    members: Sequence[Member],
    scope: Scope,
) -> RelatedPlan:
    """The copies the namespace ``scope`` needs for every related entry (``inputs`` by entry
    name)."""
    out = RelatedPlan()
    for spec in specs:
        plan_one(spec, inputs[spec.name], members=members, scope=scope, out=out)
    return out
