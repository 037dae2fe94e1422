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
  replica, and a restarted one, computes the same views from the object alone.
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
* **Guards** (:func:`plan_write`): a finalizer a slice added can be removed only through that
  slice (or by the operator's escape hatch, :data:`RELEASE_ANNOTATION`), and no client can write
  either annotation through a slice.

Everything here is pure: it reads labels, annotations and finalizers and returns decisions.
The proxy (writes, reads) and the cache's views ask these functions and nothing else.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import msgspec
from msgspec.structs import replace

from vwserver.clock import rfc3339
from vwserver.errors import HeldFinalizer
from vwserver.selector import Selector

__all__ = [
    "HOLDS_ANNOTATION",
    "RELEASE_ANNOTATION",
    "Hold",
    "Member",
    "WritePlan",
    "annotation_pointer",
    "as_leaving",
    "client_labels",
    "effective_holds",
    "implied_labels",
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
PROXY_ANNOTATIONS: Final = frozenset({HOLDS_ANNOTATION, RELEASE_ANNOTATION})
"""Annotations no client may write through a slice."""

Peers = Callable[[str], Selector | None]
"""The current selector of a slice by id; None for a slice this server does not know."""


def annotation_pointer(key: str) -> str:
    """The JSON pointer of annotation ``key`` (RFC 6901: ``~`` is ``~0``, ``/`` is ``~1``)."""
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")


def slice_id(cluster: str, name: str) -> str:
    """A slice's id in the holds annotation: its logical cluster and name."""
    return f"{cluster}/{name}"


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
        return _decode_holds(value)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return _NO_HOLDS


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

    def matches(self, sid: str, labels: Mapping[str, str] | None) -> bool:
        """Whether slice ``sid`` matches ``labels``; an unknown slice matches nothing, so its
        holds keep the object from every other slice until they end."""
        selector = self.selector if sid == self.id else self.peers(sid)
        return selector is not None and selector.matches(labels)


def _leaves(member: Member, sid: str, hold: Hold, labels: Mapping[str, str] | None) -> bool:
    """Whether holder ``sid`` is letting go of the object: its leave is recorded (a leave, once
    recorded, completes), or the object no longer matches it (not recorded yet)."""
    return bool(hold.leavingSince) or not member.matches(sid, labels)


def sees(
    member: Member,
    *,
    labels: Mapping[str, str] | None,
    annotations: Mapping[str, str] | None,
    finalizers: Iterable[str] | None,
) -> bool:
    """Whether ``member`` sees the object: (its labels match and no holder is letting go of
    it) or the slice holds it."""
    if not annotations or HOLDS_ANNOTATION not in annotations:
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
    if not annotations or HOLDS_ANNOTATION not in annotations:
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
    if not annotations or HOLDS_ANNOTATION not in annotations:
        return labels
    hold = effective_holds(annotations, finalizers).get(member.id)
    if hold is None or not (hold.leavingSince or not member.selector.matches(labels)):
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


def plan_write(
    member: Member,
    *,
    stored_annotations: Mapping[str, str] | None,
    stored_finalizers: Sequence[str] | None,
    result_finalizers: Sequence[str] | None,
    record: bool,
) -> WritePlan:
    """The holds after a write through ``member`` that changes the object's finalizers from
    ``stored_finalizers`` to ``result_finalizers`` (a create: no stored object).

    Finalizers the write adds are recorded for ``member`` when ``record`` (the slice's views
    can show a leaving object); finalizers another slice holds must stay
    (:class:`~vwserver.errors.HeldFinalizer`); entries are reduced to the finalizers still on
    the object.
    """
    recorded = parse_holds((stored_annotations or {}).get(HOLDS_ANNOTATION))
    before = list(stored_finalizers or ())
    after = list(result_finalizers or ())
    after_set = set(after)
    for sid, hold in recorded.items():
        if sid == member.id:
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
    return WritePlan(annotation=value, changed=value != render_holds(recorded))


def _held(finalizer: str, holder: str) -> HeldFinalizer:
    message = (
        f"finalizer {finalizer!r} was added through slice {holder} and can be removed only "
        "through that slice"
    )
    return HeldFinalizer(
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
    finalizers ``member`` holds (the one write a slice may make on an object leaving it)."""
    before = list(stored_finalizers or ())
    after = list(result_finalizers or ())
    if any(f not in before for f in after):
        return False
    removed = {f for f in before if f not in after}
    mine = effective_holds(annotations, before).get(member.id)
    return bool(removed) and mine is not None and removed <= set(mine.finalizers)
