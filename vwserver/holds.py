"""Holds: how an object moves between slices without pulling it out from under a controller.

A slice's membership used to be its label selector alone. When a consumer relabels an object
so that it leaves slice A for slice B, that made A's controllers see a plain DELETED while their
finalizer was still on the object — a finalizer they could then never remove, through a view
that no longer showed the object — and B's controllers see ADDED at the same instant. KRM's way
for a controller to let go of an object is graceful deletion with finalizers, so a move is made
to look like that to A, and B is held back until A has let go:

* **Hold.** A slice *holds* an object while the object carries a finalizer that was added
  through that slice. Which slice added which finalizer is recorded on the object itself, in
  the annotation :data:`HOLDS_ANNOTATION` (JSON: ``{"<slice cluster>/<slice name>":
  {"finalizers": [...], "leavingSince": "<RFC 3339>", "leavingLabels": {...}}}``), written by
  the proxy in the same request that adds the finalizer. kcp is the only persistence: every
  replica, and a restarted one, computes the same views from the object alone. Beside it, one
  label per holder (:func:`holder_label`), changed in the same write as the annotation
  (:attr:`WritePlan.labels`, :func:`holder_label_changes`): kcp's label selectors cannot read
  the annotation, and a LIST kcp answers asks for "held by this slice" with the label
  (:mod:`vwserver.proxy.lists`). The annotation stays the authority — a stray label costs a
  filtered row; a missing one hides the hold from such a LIST until the handoff loop repairs it.
* **Membership** (:func:`sees`): slice S sees object O iff (O's labels match S and no slice
  that holds O is letting go of it — stopped matching O, or its leave was recorded) or S holds
  O. An entry counts only while one of its finalizers is still on the object, so a stale entry
  changes nothing.
* **Leaving** (:func:`leaving_since`): while S holds O and O no longer matches S, S sees O being
  deleted — ``metadata.deletionTimestamp`` is the time vwserver first observed the move,
  recorded in the entry's ``leavingSince`` so that every replica shows the same time, and
  ``deletionGracePeriodSeconds`` is 0 (:func:`as_leaving`).
* **A deletion never goes away.** Once ``leavingSince`` is recorded the leave completes: S sees
  O being deleted until S's entry ends (its release, the operator's release, its hold
  timeout), even if O matches S again (A → B → A before A released); the cache's watches then
  send DELETED and, as O matches S again, ADDED. Kubernetes never takes a deletionTimestamp
  back, and controllers rely on that.
* **Before the move is recorded** (the few milliseconds until the handoff loop's write, which a
  read that meets the move triggers at once) S must not see O outside its selector without a
  deletion either: the cache's watches hold that version back (the recording write's change
  follows and is sent being deleted, so a LIST's resourceVersion and a watch from it agree),
  and a LIST or GET shows O being deleted since the reading replica's current time
  (:func:`as_leaving` with ``since=""``), which the recorded time replaces.
* **A client's own selector** (:func:`client_labels`): a leaving object is matched against a
  client's ``labelSelector`` by the labels it had as S last saw it (``leavingLabels``,
  recorded with ``leavingSince``; else :func:`implied_labels`), so that a client selecting by
  S's own label sees the deletion of what it holds.
* **Guards** (:func:`plan_write`, :func:`guards`): while the object is leaving a slice, the
  finalizers added through that slice can be removed only through that slice (:func:`releasable`
  is the one write it may still make) or by the hold's end (the operator's escape hatch,
  :data:`RELEASE_ANNOTATION`, or the slice's hold timeout). While the holder still sees the
  object as a member, any slice that sees the object may remove any finalizer on it, as in
  Kubernetes, and the holder's entry loses it in the same write: otherwise a user of an
  overlapping slice could record the finalizer name another slice's controller uses (a name
  is recorded for whoever adds it first) and keep that controller from ever finishing a
  deletion. A name already on the object is not recorded for a slice that "adds" it again,
  and a finalizer added before any hold was recorded is nobody's. No client can write either
  annotation through a slice.
* **kcp's garbage collector** (:func:`check_gc_finalizers`): ``orphan`` and
  ``foregroundDeletion`` are the collector's bookkeeping of a deletion in progress — the
  apiserver sets them for a DELETE, the collector removes them once it has orphaned (or
  deleted) the dependents. No write through a slice adds or removes them: removing ``orphan``
  early lets the object go before its dependents are orphaned, and the collector then deletes
  every dependent whose owner is gone, also those outside the slice; adding either changes what
  a later DELETE that names no propagation does. They are never anybody's hold.

Everything here is pure: it reads labels, annotations and finalizers and returns decisions.
The proxy (writes, reads) and the cache's views ask these functions and nothing else.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

import msgspec
from msgspec.structs import replace

from vwserver.clock import rfc3339
from vwserver.errors import GCFinalizer, HeldFinalizer, Invalid
from vwserver.related import ClaimedView, ObjectKey
from vwserver.selector import Selector

__all__ = [
    "HOLDER_LABEL_PREFIX",
    "HOLDS_ANNOTATION",
    "RELEASE_ANNOTATION",
    "Hold",
    "Member",
    "WritePlan",
    "annotation_pointer",
    "as_leaving",
    "check_gc_finalizers",
    "client_labels",
    "effective_holds",
    "guards",
    "held",
    "hidden_by_relabel",
    "holder_label",
    "holder_label_changes",
    "holder_labels",
    "implied_labels",
    "is_holder_label",
    "label_pointer",
    "leaving_safe",
    "leaving_since",
    "parse_holds",
    "plan_write",
    "render_holds",
    "sees",
    "slice_id",
]

HOLDS_ANNOTATION: Final = "sync.edge-connect.eu/holds"
"""Which slice added which finalizer, and since when each holder has been leaving the object."""
RELEASE_ANNOTATION: Final = "sync.edge-connect.eu/release"
"""The operator's escape hatch, set directly in kcp: a slice id (``<cluster>/<name>``) or
``*``; vwserver then ends those holds (removes their finalizers) and this annotation."""
DEFAULT_HOLD_TIMEOUT_SECONDS: Final = 3600.0
"""How long a slice may hold an object that is leaving it when the slice does not say
(``holdTimeoutSeconds``): every hold is bounded, because a leaving slice keeps reading the
object's *current* content — which a consumer who moved it may already be filling for the
destination. An hour is far beyond a controller's cleanup (and a restart or rollout of it),
and leaves the operator 55 minutes between the slice's ``HoldsReleased`` condition reporting
the hold stuck (after 5 minutes) and the hold ending. There is deliberately no unbounded hold:
a slice that needs longer states a longer timeout, up to :data:`MAX_HOLD_TIMEOUT_SECONDS`."""
MAX_HOLD_TIMEOUT_SECONDS: Final = 7 * 24 * 3600.0
"""The longest hold a slice may ask for (a week): beyond it a bound would be one in name only."""
PROXY_ANNOTATIONS: Final = frozenset({HOLDS_ANNOTATION, RELEASE_ANNOTATION})
"""Annotations no client may write through a slice."""
HOLDER_LABEL_PREFIX: Final = "holder.sync.edge-connect.eu/"
"""The prefix of the holder labels (:func:`holder_label`): one label per slice that has an entry
in :data:`HOLDS_ANNOTATION`, written in the same write as the entry, so that kcp can be asked
for "the objects this slice holds" with a label selector. No client may write them through a
slice."""
HOLDER_LABEL_VALUE: Final = "true"
"""The value of every holder label (what is asked for is the key's existence)."""
ORPHAN_FINALIZER: Final = "orphan"
"""metav1.FinalizerOrphanDependents: a deletion that orphans the dependents is in progress."""
FOREGROUND_FINALIZER: Final = "foregroundDeletion"
"""metav1.FinalizerDeleteDependents: a deletion that deletes the dependents first."""
GC_FINALIZERS: Final = (ORPHAN_FINALIZER, FOREGROUND_FINALIZER)
"""The finalizers of kcp's garbage collector: no write through a slice adds or removes them."""

Peers = Callable[[str], Selector | None]
"""The current selector of a slice by id; None for a slice this server does not know."""


def annotation_pointer(key: str) -> str:
    """The JSON pointer of annotation ``key`` (RFC 6901: ``~`` is ``~0``, ``/`` is ``~1``)."""
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")


def label_pointer(key: str) -> str:
    """The JSON pointer of label ``key``."""
    return "/metadata/labels/" + key.replace("~", "~0").replace("/", "~1")


def slice_id(cluster: str, name: str) -> str:
    """A slice's id in the holds annotation: its logical cluster and name."""
    return f"{cluster}/{name}"


@functools.lru_cache(maxsize=1024)
def holder_label(sid: str) -> str:
    """The label key that says "slice ``sid`` holds this object": :data:`HOLDER_LABEL_PREFIX`
    and the first 40 hex digits of the SHA-256 of the slice id. A label's name part is at most
    63 characters of ``[A-Za-z0-9_.-]`` and a slice id (``<cluster>/<name>``) is up to ~290
    characters with a ``/``, so the id itself cannot be the name; 160 bits of digest make two
    slices sharing a label out of reach (and a shared label would only cost filtered rows: the
    annotation decides membership)."""
    return HOLDER_LABEL_PREFIX + hashlib.sha256(sid.encode()).hexdigest()[:40]


def is_holder_label(key: str) -> bool:
    """Whether label ``key`` is one of vwserver's holder labels (no client writes them)."""
    return key.startswith(HOLDER_LABEL_PREFIX)


def holder_labels(annotation: str | None) -> dict[str, str]:
    """The holder labels an object whose holds annotation is ``annotation`` (as written,
    :func:`render_holds`) must carry: one per slice with an entry."""
    return {holder_label(sid): HOLDER_LABEL_VALUE for sid in parse_holds(annotation)}


def holder_label_changes(
    labels: Mapping[str, str] | None, annotation: str | None
) -> dict[str, str | None]:
    """What a write must change in ``labels`` so that the holder labels are exactly those of
    ``annotation`` (:func:`holder_labels`): each missing one set, each other one removed
    (None). Empty when they already are. The annotation is the authority — a label is only
    the index kcp can be asked by; a stray one (written in kcp directly) costs a filtered row,
    a missing one hides the hold from a pass-through read until the handoff loop repairs it."""
    wanted = holder_labels(annotation)
    have = {k: v for k, v in (labels or {}).items() if is_holder_label(k)}
    changes: dict[str, str | None] = {k: None for k in have if k not in wanted}
    changes.update({k: v for k, v in wanted.items() if have.get(k) != v})
    return changes


class Hold(msgspec.Struct, omit_defaults=True, frozen=True):
    """One slice's entry in :data:`HOLDS_ANNOTATION`."""

    finalizers: tuple[str, ...] = ()
    leavingSince: str = ""
    """When vwserver first saw the object no longer match this slice ("": not recorded). Once
    recorded, the slice sees the object leaving until this entry ends, whatever its labels
    become (a deletion never goes away)."""
    leavingLabels: dict[str, str] | None = None
    """The object's labels as the slice last saw them before it left (recorded with
    ``leavingSince``): what the slice's clients' own label selectors match while it is leaving
    (None: not recorded, e.g. an annotation written before vwserver recorded them —
    :func:`client_labels` then derives them from the slice's selector)."""


_decode_holds: Final = msgspec.json.Decoder(dict[str, Hold]).decode
_encode: Final = msgspec.json.Encoder(order="sorted").encode
_NO_HOLDS: Final[Mapping[str, Hold]] = {}


@functools.lru_cache(maxsize=4096)
def parse_holds(value: str | None) -> Mapping[str, Hold]:
    """The holds an annotation value records. A value that is not what vwserver writes (an
    edit made directly in kcp) records nothing: the object then behaves as if never held."""
    if not value:
        return _NO_HOLDS
    try:
        holds = _decode_holds(value)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return _NO_HOLDS
    # kcp's garbage-collector finalizers are nobody's hold (no write through a slice adds them;
    # an entry naming one was edited in kcp): no hold keeps them, no hold's end removes them.
    if any(f in GC_FINALIZERS for hold in holds.values() for f in hold.finalizers):
        holds = {
            sid: replace(
                hold, finalizers=tuple(f for f in hold.finalizers if f not in GC_FINALIZERS)
            )
            for sid, hold in holds.items()
        }
    return holds


def render_holds(holds: Mapping[str, Hold]) -> str | None:
    """The annotation value for ``holds``; None when there is nothing to record (the annotation
    is then removed). Sorted, so that equal holds are equal strings (no needless writes)."""
    kept = {k: v for k, v in holds.items() if v.finalizers}
    return _encode(kept).decode() if kept else None


def effective_holds(
    annotations: Mapping[str, str] | None, finalizers: Iterable[str] | None
) -> dict[str, Hold]:
    """The entries that hold the object now: those with a finalizer still on it (each reduced
    to the finalizers still there)."""
    recorded = parse_holds((annotations or {}).get(HOLDS_ANNOTATION))
    if not recorded:
        return {}
    present = set(finalizers or ())
    out: dict[str, Hold] = {}
    for sid, hold in recorded.items():
        kept = tuple(f for f in hold.finalizers if f in present)
        if kept:
            out[sid] = hold if kept == hold.finalizers else replace(hold, finalizers=kept)
    return out


@dataclass(frozen=True, slots=True)
class Member:
    """A slice as membership sees it: its id, its selector, and the other slices' selectors
    (looked up when asked, so that a view always uses the current ones)."""

    selector: Selector
    id: str = ""
    peers: Peers = field(default=lambda _sid: None)
    unrecorded: Callable[[], None] | None = field(default=None, compare=False)
    """Told when a read finds an object leaving the slice whose move is not recorded yet (the
    handoff loop then records it at once instead of at its next scan)."""
    claimed: ClaimedView | None = None
    """Set when the resource is one of the export's permission claims: membership is then the
    slice's related-resource rules for it alone (:mod:`vwserver.related`), never the selector
    or holds."""

    def matches(self, sid: str, labels: Mapping[str, str] | None) -> bool:
        """Whether slice ``sid`` matches ``labels``; an unknown slice matches nothing, so its
        holds keep the object from every other slice until they end."""
        selector = self.selector if sid == self.id else self.peers(sid)
        return selector is not None and selector.matches(labels)


def _leaves(member: Member, sid: str, hold: Hold, labels: Mapping[str, str] | None) -> bool:
    """Whether holder ``sid`` is letting go of the object: its leave is recorded (a leave, once
    recorded, completes), or the object no longer matches it (not recorded yet)."""
    return bool(hold.leavingSince) or not member.matches(sid, labels)


def held(annotations: Mapping[str, str] | None) -> bool:
    """Whether any slice may hold an object with ``annotations``; when not, :func:`sees` is
    its selector alone (a LIST's hot loop asks this before the whole rule)."""
    return annotations is not None and HOLDS_ANNOTATION in annotations


def sees(
    member: Member,
    *,
    labels: Mapping[str, str] | None,
    annotations: Mapping[str, str] | None,
    finalizers: Iterable[str] | None,
    key: ObjectKey | None = None,
) -> bool:
    """Whether ``member`` sees the object: (its labels match and no holder is letting go of
    it) or the slice holds it. For a claimed resource: whether a related-resource rule shows
    the object ``key`` (cluster, namespace, name; None — unknown — never)."""
    if member.claimed is not None:
        return member.claimed.sees(key, labels)
    if not held(annotations):
        return member.selector.matches(labels)  # never held: the selector alone
    holds = effective_holds(annotations, finalizers)
    if member.id in holds:
        return True
    return member.selector.matches(labels) and not any(
        _leaves(member, sid, hold, labels) for sid, hold in holds.items()
    )


def leaving_since(
    member: Member,
    *,
    labels: Mapping[str, str] | None,
    annotations: Mapping[str, str] | None,
    finalizers: Iterable[str] | None,
) -> str | None:
    """For an object ``member`` holds and is letting go of: when the move was first seen —
    recorded, whatever the labels are now (monotonic: the leave completes when the hold ends);
    ``""`` while it is not recorded yet and the labels no longer match (``member.unrecorded``
    is told). None for any other object."""
    if not annotations or HOLDS_ANNOTATION not in annotations or member.claimed is not None:
        return None
    hold = effective_holds(annotations, finalizers).get(member.id)
    if hold is None:
        return None
    if hold.leavingSince:
        return hold.leavingSince
    if member.selector.matches(labels):
        return None
    if member.unrecorded is not None:
        member.unrecorded()
    return ""


def implied_labels(selector: Selector, labels: Mapping[str, str] | None) -> dict[str, str]:
    """``labels`` made to satisfy what ``selector`` pins down: each key it requires to have one
    value set to it, each key it forbids (or whose value it excludes) removed. For an object
    that left the slice, the best guess at its labels before it left when none were recorded
    (the label a move changes is, in the common case, the slice's own)."""
    out = dict(labels or {})
    for r in selector.requirements:
        op = r.operator.value
        if op in ("=", "==", "in") and len(r.values) == 1:
            out[r.key] = r.values[0]
        elif op == "!" or (op in ("!=", "notin") and out.get(r.key) in r.values):
            out.pop(r.key, None)
    return out


def client_labels(
    member: Member,
    *,
    labels: Mapping[str, str] | None,
    annotations: Mapping[str, str] | None,
    finalizers: Iterable[str] | None,
) -> Mapping[str, str] | None:
    """The labels a client's own ``labelSelector`` is matched against through ``member``.

    An object leaving the slice is matched by the labels it had as the slice last saw it
    (``leavingLabels``, recorded with the move; before that, or in an annotation written
    without them, :func:`implied_labels`): a client that selects by the slice's own label —
    controller-runtime's ``ByObject`` label selectors do — must see the deletion of what it
    holds, not lose the object with its finalizer still on it. Any other object: its labels.
    """
    if not annotations or HOLDS_ANNOTATION not in annotations or member.claimed is not None:
        return labels
    hold = effective_holds(annotations, finalizers).get(member.id)
    if hold is None or not _leaves(member, member.id, hold, labels):
        return labels
    if hold.leavingLabels is not None:
        return hold.leavingLabels
    return implied_labels(member.selector, labels)


def leaving_safe(client: Selector, *, slice_selector: Selector) -> Selector:
    """What of a client's own selector an upstream may filter by for a slice whose objects
    may be leaving it: the requirements on keys ``slice_selector`` does not name. A leaving
    object is matched by its labels before the move (:func:`client_labels`), and a move changes
    the slice's own labels; the rest of the client's selector is applied in process."""
    own = {r.key for r in slice_selector.requirements}
    return Selector(tuple(r for r in client.requirements if r.key not in own))


def as_leaving(raw: bytes, since: str, *, now: Callable[[], str] | None = None) -> bytes:
    """The object as a slice that is letting go of it sees it: being deleted since ``since``
    with no grace period. A real deletion shows as it is (its own timestamp).

    ``since`` is ``""`` for a move not recorded yet (a read in the few milliseconds before the
    handoff loop's write): the object is shown being deleted all the same, since the reading
    replica's current time (``now``), which the recorded time replaces one write later — the
    slice never sees an object outside its selector without a deletion."""
    doc: Any = msgspec.json.decode(raw)
    metadata = doc.setdefault("metadata", {}) if isinstance(doc, dict) else None
    if not isinstance(metadata, dict) or metadata.get("deletionTimestamp"):
        return raw
    metadata["deletionTimestamp"] = since or (now or _now)()
    metadata["deletionGracePeriodSeconds"] = 0
    return msgspec.json.encode(doc)


def _now() -> str:
    return rfc3339(datetime.now(UTC))


# --- writes -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WritePlan:
    """What a write through a slice does to the holds."""

    annotation: str | None
    """The holds annotation the written object must carry (None: none)."""
    changed: bool
    """Whether that differs from what the stored object carries."""
    labels: Mapping[str, str | None] = field(default_factory=dict)
    """The holder labels the write must change (:func:`holder_label_changes`; None: remove),
    relative to the labels the client's write leaves on the object."""

    @property
    def changes(self) -> bool:
        """Whether the write must change the annotation or a holder label."""
        return self.changed or bool(self.labels)


def plan_write(
    member: Member,
    *,
    stored_labels: Mapping[str, str] | None,
    stored_annotations: Mapping[str, str] | None,
    stored_finalizers: Sequence[str] | None,
    result_labels: Mapping[str, str] | None,
    result_finalizers: Sequence[str] | None,
    record: bool,
) -> WritePlan:
    """The holds after a write through ``member`` that changes the object from
    (``stored_labels``, ``stored_finalizers``) to (``result_labels``, ``result_finalizers``)
    (a create: no stored object).

    Finalizers the write adds — names not on the stored object — are recorded for ``member``
    when ``record`` (the slice's views can show a leaving object); a name already there is
    not the writer's. A finalizer another slice holds may be removed unless that slice is
    leaving the object (:func:`guards`; else :class:`~vwserver.errors.HeldFinalizer`).
    Entries are reduced to the finalizers still on the object, so a finalizer removed through
    any slice leaves its holder's entry in the same write (the entry with its last one).
    Neither of kcp's garbage-collector finalizers may come or go (:func:`check_gc_finalizers`).
    """
    before = list(stored_finalizers or ())
    after = list(result_finalizers or ())
    check_gc_finalizers(before, after)
    recorded = parse_holds((stored_annotations or {}).get(HOLDS_ANNOTATION))
    after_set = set(after)
    for sid, hold in recorded.items():
        if sid == member.id or not guards(
            member, sid, hold, stored_labels=stored_labels, result_labels=result_labels
        ):
            continue
        for f in hold.finalizers:
            if f in before and f not in after_set:
                raise _held(f, sid)
    added = [f for f in after if f not in before]
    holds: dict[str, Hold] = {}
    for sid, hold in recorded.items():
        kept = tuple(f for f in hold.finalizers if f in after_set)
        if kept:
            holds[sid] = replace(hold, finalizers=kept)
    if record and added:
        mine = holds.get(member.id, Hold())
        merged = tuple(dict.fromkeys([*mine.finalizers, *added]))
        holds[member.id] = replace(mine, finalizers=merged)
    value = render_holds(holds)
    return WritePlan(
        annotation=value,
        changed=value != render_holds(recorded),
        labels=holder_label_changes(result_labels, value),
    )


def check_gc_finalizers(before: Iterable[str] | None, after: Iterable[str] | None) -> None:
    """Refuses (:class:`~vwserver.errors.GCFinalizer`, 422) a write whose finalizers go from
    ``before`` to ``after`` adding or removing one of :data:`GC_FINALIZERS`.

    They belong to kcp's garbage collector. A DELETE with ``propagationPolicy=Orphan`` sets
    ``orphan``; the collector removes the dependents' ownerReferences, then the finalizer. A
    slice that removed it first would let the owner go while its dependents still name it, and
    the collector deletes a dependent whose owners are all gone — one outside the slice too,
    which the DELETE's dependents check let through only because it orphaned them. Removing
    ``foregroundDeletion`` early makes a foreground deletion a background one. Adding either
    to a live object decides the propagation of a later DELETE that names none (also one made
    outside the slice); the apiserver itself refuses new finalizers on an object being deleted.
    Only DELETE (through the dependents check) changes them, as in Kubernetes."""
    was = {f for f in before or () if f in GC_FINALIZERS}
    now = {f for f in after or () if f in GC_FINALIZERS}
    if was == now:
        return
    changes = [f"adds {f!r}" for f in sorted(now - was)] + [
        f"removes {f!r}" for f in sorted(was - now)
    ]
    message = (
        f"the write {' and '.join(changes)}: the finalizers {', '.join(map(repr, GC_FINALIZERS))} "
        "belong to kcp's garbage collector, and a write through a slice can neither add nor "
        "remove them (a DELETE's propagationPolicy sets them)"
    )
    raise _finalizers_forbidden(GCFinalizer, message)


def guards(
    member: Member,
    holder: str,
    hold: Hold,
    *,
    stored_labels: Mapping[str, str] | None,
    result_labels: Mapping[str, str] | None,
) -> bool:
    """Whether slice ``holder``'s finalizers are kept from a write through another slice:
    while ``holder`` is *leaving* the object — its move is recorded (``leavingSince``), or its
    selector matches the object's labels no longer, or would not after the write (an unknown
    slice matches nothing). While the holder still sees the object as a member, a finalizer
    on it is like any other in Kubernetes: whoever may write the object may remove it. So a
    name another slice recorded first (by chance, or squatting on the name a controller uses)
    never keeps a controller from finishing its own finalizer; what a hold protects is the one
    thing only vwserver can break — a controller's last look at an object leaving its slice."""
    return _leaves(member, holder, hold, stored_labels) or _leaves(
        member, holder, hold, result_labels
    )


def hidden_by_relabel(
    member: Member,
    *,
    stored_labels: Mapping[str, str] | None,
    labels: Mapping[str, str] | None,
    annotations: Mapping[str, str] | None,
    finalizers: Iterable[str] | None,
    key: ObjectKey | None = None,
) -> bool:
    """Whether a write through ``member`` whose result has ``labels``, ``annotations`` and
    ``finalizers`` hides the object from ``member`` *by its relabel* (a slice that holds the
    object would stop matching it): it would be seen with the stored labels, not with the new
    ones. A write that hides it only by removing the slice's own last finalizer while another
    slice is leaving the object is not refused — the slice lets go of its hold, and sees the
    object again (ADDED) once the leaving slice has let go of it."""
    if sees(member, labels=labels, annotations=annotations, finalizers=finalizers, key=key):
        return False
    return sees(
        member, labels=stored_labels, annotations=annotations, finalizers=finalizers, key=key
    )


def _held(finalizer: str, holder: str) -> HeldFinalizer:
    message = (
        f"finalizer {finalizer!r} was added through slice {holder}, which the object is "
        "leaving: until that slice lets go, it can be removed only through that slice"
    )
    return _finalizers_forbidden(HeldFinalizer, message)


_Refusal = TypeVar("_Refusal", bound=Invalid)


def _finalizers_forbidden(error: type[_Refusal], message: str) -> _Refusal:
    """``error`` (a 422) as the apiserver words a refused field: the field path before the
    message, and one ``FieldValueForbidden`` cause naming ``metadata.finalizers``."""
    return error(
        f"metadata.finalizers: {message}",
        details={
            "causes": [
                {
                    "reason": "FieldValueForbidden",
                    "message": message,
                    "field": "metadata.finalizers",
                }
            ]
        },
    )


def releasable(
    member: Member,
    *,
    stored_finalizers: Sequence[str] | None,
    result_finalizers: Sequence[str] | None,
    annotations: Mapping[str, str] | None,
) -> bool:
    """Whether going from ``stored_finalizers`` to ``result_finalizers`` only removes
    finalizers ``member`` holds (the one write a slice may make on an object leaving it).
    Another slice's finalizers stay whatever that slice's state: a leaving slice lets go of
    its own hold and touches nothing else, so a release can never take a finalizer from a
    slice that still sees the object as a member, nor from one leaving it too."""
    before = list(stored_finalizers or ())
    after = list(result_finalizers or ())
    if any(f not in before for f in after):
        return False
    removed = {f for f in before if f not in after}
    mine = effective_holds(annotations, before).get(member.id)
    return bool(removed) and mine is not None and removed <= set(mine.finalizers)
