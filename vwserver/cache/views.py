"""Who sees what in the shared watch cache — pure, no I/O.

Every client of a slice reads the same store; what each one sees is decided here, from an
object's decoded metadata alone, in three layers:

* **Membership** (:func:`visible`): whether an object belongs to a slice. It is the *one*
  membership function — every read path (LIST pages, GET from the cache, watch transitions) asks
  it and nothing else, so that a richer membership (the handoff between slices, which depends on
  finalizers and an annotation) changes one function: :func:`vwserver.holds.sees` — the
  slice's label selector, and the holds that keep an object moving between slices in the
  slice it leaves until that slice lets go (and out of the one it enters until then).
* **The client's own filter** (:class:`ClientFilter`): the logical cluster and namespace of the
  request path, and the client's ``labelSelector`` and ``fieldSelector``, with the apiserver's
  semantics. Field selectors follow ``k8s.io/apimachinery/pkg/fields`` (``ParseSelector``: terms
  split at unescaped commas and sorted, the first ``!=``, ``==`` or ``=`` of a term splits it,
  ``\\,`` ``\\=`` ``\\\\`` escapes in values); custom resources support only ``metadata.name`` and
  (namespaced ones) ``metadata.namespace`` — the CRD converter's ``field label not supported``.
* **The watch transition** (:func:`transition`): the watch cache's ``convertToWatchEvent``
  (k8s.io/apiserver/pkg/storage/cacher/cache_watcher.go). For one change, the old version passes
  if it existed, was visible and matched the client; the new one likewise. Both pass: MODIFIED;
  only the new: ADDED; only the old: DELETED carrying the *previous* content (the client may
  only ever receive what it was allowed to see) at the change's resourceVersion; neither:
  nothing. Applied in order to the client's initial state, these events always reproduce the
  client's visible set (the informer invariant, tests/unit/test_cache_views.py). The handoff
  adds two rules: a version leaving the slice whose move is not recorded yet is held back
  (:func:`pending`), and a leave that completes while the object matches the slice again is a
  DELETED then an ADDED, never a MODIFIED that takes the deletionTimestamp away.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from vwserver.cache.entries import Change, ChangeType, Entry, Meta
from vwserver.errors import BadRequest
from vwserver.holds import Member, client_labels, leaving_since, sees
from vwserver.selector import Selector

__all__ = [
    "EVERYTHING",
    "ClientFilter",
    "Event",
    "FieldRequirement",
    "FieldSelector",
    "FieldSelectorError",
    "SliceView",
    "accepts",
    "departed",
    "leaving",
    "parse_field_selector",
    "pending",
    "seen",
    "transition",
    "visible",
    "with_resource_version",
]


# --- membership -------------------------------------------------------------------------------


SliceView = Member
"""What decides a slice's membership: its id, its selector and its peers' selectors (the
holds between slices, :mod:`vwserver.holds`)."""


def visible(view: SliceView, meta: Meta) -> bool:
    """Whether the object with ``meta`` belongs to the slice ``view``."""
    return sees(
        view,
        labels=meta.labels,
        annotations=meta.annotations,
        finalizers=meta.finalizers,
        key=(meta.cluster, meta.namespace, meta.name),
    )


def leaving(view: SliceView, meta: Meta) -> str | None:
    """When the object with ``meta`` started leaving ``view`` (``""``: not recorded yet), or
    None when it is not leaving (:func:`vwserver.holds.leaving_since`)."""
    return leaving_since(
        view, labels=meta.labels, annotations=meta.annotations, finalizers=meta.finalizers
    )


def pending(view: SliceView, meta: Meta) -> bool:
    """Whether the object with ``meta`` is leaving ``view`` but its move is not recorded yet
    (and kcp is not deleting it): a watch holds such a version back — the recording write's
    change follows at once and is sent being deleted — so that the slice never sees the
    object outside its selector without a deletion."""
    return meta.deletion_timestamp is None and leaving(view, meta) == ""


def seen(view: SliceView, client: ClientFilter, meta: Meta) -> bool:
    """Whether a client of ``view`` with ``client``'s filter sees the object with ``meta``:
    the slice sees it, and the client's own selectors take it — an object leaving the slice
    by the labels it had as the slice last saw it (:func:`vwserver.holds.client_labels`), so
    that a client selecting by the slice's own label sees the deletion too."""
    if not visible(view, meta):
        return False
    labels = client_labels(
        view, labels=meta.labels, annotations=meta.annotations, finalizers=meta.finalizers
    )
    return client.matches(meta, labels=labels)


# --- field selectors ----------------------------------------------------------------------------

NAME: Final = "metadata.name"
NAMESPACE: Final = "metadata.namespace"
_OPERATORS: Final = ("!=", "==", "=")  # "==" before "=": "a==b" is not "a" = "=b"
_SPECIAL: Final = frozenset("\\,=")


class FieldSelectorError(BadRequest, ValueError):
    """A ``fieldSelector`` the apiserver refuses (400), with the apiserver's message."""


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    """``field = value`` (``equals``) or ``field != value``."""

    field: str
    equals: bool
    value: str


@dataclass(frozen=True, slots=True)
class FieldSelector:
    """An AND of field requirements; no requirement selects everything."""

    requirements: tuple[FieldRequirement, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.requirements

    def matches(self, meta: Meta) -> bool:
        for r in self.requirements:
            # fields.Set.Get: a field the object does not have reads as "".
            field = r.field
            actual = meta.name if field == NAME else meta.namespace if field == NAMESPACE else ""
            if (actual == r.value) != r.equals:
                return False
        return True

    def requires(self, field: str) -> str | None:
        """The value ``field`` must equal, if a requirement pins it (RequiresExactMatch)."""
        for r in self.requirements:
            if r.field == field and r.equals:
                return r.value
        return None

    def render(self) -> str:
        """The selector in the query syntax, as ``fields.Selector.String()`` writes it."""
        return ",".join(
            f"{r.field}{'=' if r.equals else '!='}{escape_field_value(r.value)}"
            for r in self.requirements
        )


EVERYTHING: Final = FieldSelector()


def escape_field_value(value: str) -> str:
    """``fields.EscapeValue``: ``\\`` then ``,`` and ``=`` prefixed with a backslash."""
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


def _split_terms(text: str) -> list[str]:
    # splitTerms: commas separate terms unless escaped; the backslash stays in the term.
    if not text:
        return []
    terms: list[str] = []
    start, escaped = 0, False
    for index, char in enumerate(text):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == ",":
            terms.append(text[start:index])
            start = index + 1
    terms.append(text[start:])
    return terms


def _split_term(term: str) -> tuple[str, str, str] | None:
    # splitTerm: no escaping in the field, so the first operator anywhere splits the term.
    for index in range(len(term)):
        for op in _OPERATORS:
            if term.startswith(op, index):
                return term[:index], op, term[index + len(op) :]
    return None


def _unescape(value: str) -> str:
    # UnescapeValue: only \\ \, \= are escapes, and , = must be escaped in a value.
    if not _SPECIAL.intersection(value):
        return value
    out: list[str] = []
    escaped = False
    for char in value:
        if escaped:
            if char not in _SPECIAL:
                raise FieldSelectorError(
                    f"invalid field selector: invalid escape sequence: \\{char}"
                )
            out.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in ",=":
            # Go formats the rune with %v: its code point as a number.
            raise FieldSelectorError(
                f"invalid field selector: unescaped character in value: {ord(char)}"
            )
        else:
            out.append(char)
    if escaped:
        raise FieldSelectorError("invalid field selector: invalid escape sequence: \\")
    return "".join(out)


def parse_field_selector(text: str, *, namespaced: bool = True) -> FieldSelector:
    """Parse a ``fieldSelector`` for a custom resource (``namespaced`` or cluster-scoped).

    Raises :class:`FieldSelectorError` with the apiserver's message: a term without operator
    (``invalid selector: '<text>'; can't understand '<term>'``), a bad escape, or a field a
    custom resource does not support (``field label not supported: <field>``). Terms are
    checked in sorted order, so with several bad terms the same one is named.
    """
    requirements: list[FieldRequirement] = []
    for part in sorted(_split_terms(text)):
        if not part:
            continue
        split = _split_term(part)
        if split is None:
            raise FieldSelectorError(f"invalid selector: '{text}'; can't understand '{part}'")
        field, op, value = split
        requirements.append(FieldRequirement(field, op != "!=", _unescape(value)))
    # The CRD converter (ConvertFieldLabel) runs after the whole selector parsed.
    for r in requirements:
        if not (r.field == NAME or (namespaced and r.field == NAMESPACE)):
            raise FieldSelectorError(f"field label not supported: {r.field}")
    return FieldSelector(tuple(requirements))


# --- a client's filter --------------------------------------------------------------------------

_ALL: Final = Selector()


@dataclass(frozen=True, slots=True)
class ClientFilter:
    """What one request narrows the slice to."""

    cluster: str = "*"
    """The logical cluster of the path; ``*``: all of them."""
    namespace: str | None = None
    """The namespace of the path; None: all namespaces."""
    labels: Selector = _ALL
    """The client's ``labelSelector``."""
    fields: FieldSelector = EVERYTHING
    """The client's ``fieldSelector``."""

    def matches(self, meta: Meta, *, labels: Mapping[str, str] | None = None) -> bool:
        """Whether the object with ``meta`` passes; its ``labelSelector`` matched against
        ``labels`` when given (an object leaving the slice, :func:`seen`)."""
        if self.cluster != "*" and meta.cluster != self.cluster:
            return False
        if self.namespace is not None and meta.namespace != self.namespace:
            return False
        return self.fields.matches(meta) and self.labels.matches(
            meta.labels if labels is None else labels
        )


def accepts(view: SliceView, client: ClientFilter) -> Callable[[Entry], bool]:
    """The predicate a LIST pages with (:meth:`vwserver.cache.store.Store.page`)."""

    def accept(item: Entry) -> bool:
        return seen(view, client, item.meta)

    return accept


# --- watch transitions --------------------------------------------------------------------------


Event = tuple[ChangeType, Entry]
"""One watch event: its type and the entry it carries."""


def transition(*, view: SliceView, client: ClientFilter, change: Change) -> tuple[Event, ...]:
    """What one change means to one client of one slice: the events to send, in order (none,
    one, or a DELETED and an ADDED) — cacheWatcher.convertToWatchEvent, plus the handoff's
    rules (:mod:`vwserver.holds`).

    A DELETED carries the object as the client last could see it, at the change's
    resourceVersion (:func:`departed`): for a deletion, the object as the upstream's DELETED
    event carried it; for an object that left the client's view, its previous version with the
    resourceVersion rewritten (the apiserver does the same). That entry is built once per change
    and shared by every client it goes to.

    The handoff adds two rules. A version that is leaving the slice before its move is
    recorded (:func:`pending`) is held back: the recording write's change comes next and is
    sent being deleted. And an object that was leaving the slice and no longer is (the slice
    released it, or its hold ended, while its labels match the slice again) was being deleted:
    its deletion completes — DELETED — and it comes back as the object it now is — ADDED, both
    at the change's resourceVersion — never a MODIFIED that takes the deletionTimestamp away.
    """
    prev, new = change.prev, change.new
    old_passes = prev is not None and seen(view, client, prev.meta)
    if new is not None and seen(view, client, new.meta):
        if pending(view, new.meta):
            return ()
        if not old_passes:
            return (("ADDED", new),)
        assert prev is not None
        if leaving(view, prev.meta) is not None and leaving(view, new.meta) is None:
            return (("DELETED", departed(change)), ("ADDED", new))
        return (("MODIFIED", new),)
    if not old_passes:
        return ()
    return (("DELETED", departed(change)),)


def departed(change: Change) -> Entry:
    """The entry a DELETED for ``change`` carries: the previous version at the change's
    resourceVersion — for a deletion the upstream's DELETED object when it is exactly that
    (the apiserver sends the previous content with the deletion's resourceVersion), else the
    previous version rewritten. The same for every client (memoized on the change), and never
    anything but what a client that saw the previous version was allowed to see."""
    if change.departed is not None:
        return change.departed
    prev, deleted = change.prev, change.deleted
    assert prev is not None, "only a change of an existing object can make it leave"
    same = deleted is not None and deleted.meta == msgspec.structs.replace(
        prev.meta, resource_version=deleted.meta.resource_version
    )
    result = _at(deleted if same and deleted is not None else prev, change.rv)
    change.departed = result
    return result


def _at(item: Entry, rv: int) -> Entry:
    if item.meta.resource_version == rv:
        return item
    meta = msgspec.structs.replace(item.meta, resource_version=rv)
    return Entry(raw=with_resource_version(item, rv), meta=meta)


def with_resource_version(item: Entry, rv: int) -> bytes:
    """The entry's JSON with ``metadata.resourceVersion`` set to ``rv`` (every other member
    kept, in order)."""
    doc: Any = msgspec.json.decode(item.raw)
    if not isinstance(doc, dict):
        raise ValueError("an entry that is no JSON object")
    metadata = doc.get("metadata")
    if not isinstance(metadata, dict):
        metadata = doc["metadata"] = {}
    metadata["resourceVersion"] = str(rv)
    return msgspec.json.encode(doc)
