"""Related resources of a slice: which objects of the export's permission claims it shows — pure.

A provider reaches objects of other APIs in its consumers' workspaces (core ``secrets`` and
``configmaps`` above all) through the permission claims of its APIExport, accepted in each
consumer's APIBinding; kcp's APIExport virtual workspace then serves them beside the export's
own resources. Through a slice they are filtered too: ``spec.relatedResources[]`` says, per
claimed resource, which of its objects are visible — a label ``selector``, or ``referencedBy``:
the objects that objects *visible through the slice* name at a path (a MongoDB's
``spec.users[*].passwordSecretRef.name``), in the same logical cluster and namespace. A claimed
object is visible iff a rule matches it; a claimed resource without a rule shows nothing.

``referencedBy`` is live, so membership needs an index: :class:`ReferenceIndex` keeps, in the
style of client-go's ``Indexer``, per referencing object the names it references (by claimed
resource) and per referenced object the referrers that name it. Whoever follows the referencing
objects (the watch cache) tells it, per event, what one object references *now* — nothing when
it is not visible through the slice (it left the slice, another slice holds it, it was
deleted) — and gets back only the referenced objects whose visibility changed: the cost of an
event is the difference between its old and new references, never a scan.

Nothing here does I/O: parsing the slice's rules (errors name the field), evaluating a path
over a decoded object, the index, and the membership decision.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from vwserver.errors import ConfigError, SelectorError
from vwserver.names import OBJECT_NAME_RE
from vwserver.selector import Selector

FIELD: Final = "spec.relatedResources"
MAX_RULES: Final = 16
"""As the CRD's ``maxItems``; a slice stored under an older schema is refused beyond it."""
MAX_NAMES_PER_OBJECT: Final = 64
"""References one object contributes at most, per rule (a list path over a huge list costs no
more than this per event); further names are ignored — the rule's documented bound."""

ClaimKey = tuple[str, str]
"""(group, resource) of a claimed resource; group ``""`` is the core group."""
ObjectKey = tuple[str, str, str]
"""(logical cluster, namespace, name) of one object."""
ReferrerKey = tuple[str, str, str, str, str]
"""(group, resource, logical cluster, namespace, name) of a referencing object."""

_STEP_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]*)(\[\*\])?$")
_RESOURCE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_GROUP_RE = re.compile(r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True, slots=True)
class Step:
    """One field of a reference path; ``each``: the field is a list, every element goes on."""

    name: str
    each: bool = False


def parse_path(text: str, *, field: str) -> tuple[Step, ...]:
    """``spec.users[*].passwordSecretRef.name`` → its steps; a :class:`ConfigError` naming
    ``field`` for anything else (a leading ``.`` or ``{}`` of kubectl's JSONPath is refused,
    not guessed at)."""
    if not text or len(text) > 256:
        raise ConfigError(field, "must be 1 to 256 characters")
    steps = []
    for part in text.split("."):
        m = _STEP_RE.match(part)
        if m is None:
            raise ConfigError(
                field,
                f"{text!r} is not a reference path: field names separated by '.', '[*]' after "
                "a list field (spec.users[*].passwordSecretRef.name)",
            )
        steps.append(Step(m.group(1), each=m.group(2) is not None))
    return tuple(steps)


def names_at(
    obj: Any, path: Sequence[Step], *, limit: int = MAX_NAMES_PER_OBJECT
) -> frozenset[str]:
    """The object names found at ``path`` in the decoded object ``obj``: strings that are valid
    object names; missing fields, other types and invalid names yield nothing. At most
    ``limit`` names."""
    found: set[str] = set()
    level: list[Any] = [obj]
    for step in path:
        nxt: list[Any] = []
        for value in level:
            if not isinstance(value, Mapping):
                continue
            child = value.get(step.name)
            if step.each:
                if isinstance(child, list):
                    nxt.extend(child)
            elif child is not None:
                nxt.append(child)
        level = nxt
        if not level:
            return frozenset()
    for value in level:
        if isinstance(value, str) and len(value) <= 253 and OBJECT_NAME_RE.match(value):
            found.add(value)
            if len(found) >= limit:
                break
    return frozenset(found)


@dataclass(frozen=True, slots=True)
class Reference:
    """``referencedBy``: names at ``path`` in the objects of the export's resource ``source``
    (group, resource) that are visible through the slice. ``version`` is the version the
    index reads it at (a watch needs one; the names are in the same place in every version
    of a well-behaved API)."""

    path: tuple[Step, ...]
    text: str
    source: ClaimKey
    version: str

    def applies_to(self, group: str, resource: str) -> bool:
        return self.source == (group, resource)

    @property
    def collection_path(self) -> str:
        """The referencing collection below a cluster, ``/apis/<g>/<v>/<resource>``."""
        group, resource = self.source
        prefix = f"/apis/{group}/{self.version}" if group else f"/api/{self.version}"
        return f"{prefix}/{resource}"


@dataclass(frozen=True, slots=True)
class Rule:
    """One entry of ``spec.relatedResources``: exactly one of ``selector`` and ``reference``."""

    index: int
    group: str
    resource: str
    selector: Selector | None = None
    reference: Reference | None = None

    @property
    def claim(self) -> ClaimKey:
        return (self.group, self.resource)

    @property
    def field(self) -> str:
        return f"{FIELD}[{self.index}]"

    def describe(self) -> str:
        """For a 422 and a status message: which rule, and what it asks."""
        if self.selector is not None:
            return f"{self.field} (selector {self.selector.render()!r})"
        assert self.reference is not None
        source = _resource_name(*self.reference.source)
        return f"{self.field} (referencedBy {self.reference.text!r} of {source})"


def _resource_name(group: str, resource: str) -> str:
    return f"{resource}.{group}" if group else resource


@dataclass(frozen=True, slots=True)
class RelatedRules:
    """A slice's related-resource rules, by claimed resource."""

    rules: tuple[Rule, ...] = ()
    _by_claim: Mapping[ClaimKey, tuple[Rule, ...]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        by: dict[ClaimKey, list[Rule]] = {}
        for rule in self.rules:
            by.setdefault(rule.claim, []).append(rule)
        object.__setattr__(self, "_by_claim", {k: tuple(v) for k, v in by.items()})

    def for_claim(self, group: str, resource: str) -> tuple[Rule, ...]:
        return self._by_claim.get((group, resource), ())

    @property
    def claims(self) -> frozenset[ClaimKey]:
        return frozenset(self._by_claim)

    def references(self) -> Iterator[Rule]:
        return (r for r in self.rules if r.reference is not None)

    def sources(self) -> tuple[Reference, ...]:
        """One :class:`Reference` per referencing collection (group, version, resource) the
        index must follow, in rule order."""
        out: dict[tuple[str, str, str], Reference] = {}
        for rule in self.references():
            assert rule.reference is not None
            ref = rule.reference
            out.setdefault((*ref.source, ref.version), ref)
        return tuple(out.values())

    def references_from(self, group: str, resource: str) -> tuple[Rule, ...]:
        """The ``referencedBy`` rules whose references objects of (group, resource) make."""
        return tuple(
            r
            for r in self.rules
            if r.reference is not None and r.reference.applies_to(group, resource)
        )

    def __bool__(self) -> bool:
        return bool(self.rules)


def parse_rules(raw: object, *, field: str = FIELD) -> RelatedRules:
    """``spec.relatedResources`` of a slice (kcp validated it against the CRD; this checks it
    again, for slices stored under an older schema and for a plain CRD without CEL): a
    :class:`ConfigError` naming the field of the first problem."""
    if raw is None:
        return RelatedRules()
    if not isinstance(raw, list):
        raise ConfigError(field, "must be a list")
    if len(raw) > MAX_RULES:
        raise ConfigError(field, f"at most {MAX_RULES} rules")
    return RelatedRules(
        tuple(_parse_rule(i, item, field=f"{field}[{i}]") for i, item in enumerate(raw))
    )


def _parse_rule(index: int, raw: object, *, field: str) -> Rule:
    if not isinstance(raw, Mapping):
        raise ConfigError(field, "must be an object")
    unknown = set(raw) - {"group", "resource", "selector", "referencedBy"}
    if unknown:
        raise ConfigError(f"{field}.{sorted(unknown)[0]}", "unknown field")
    group = _string(raw.get("group", ""), field=f"{field}.group")
    resource = _string(raw.get("resource"), field=f"{field}.resource")
    if not _GROUP_RE.match(group):
        raise ConfigError(f"{field}.group", f"{group!r} is not an API group")
    if not resource or not _RESOURCE_RE.match(resource):
        raise ConfigError(f"{field}.resource", f"{resource!r} is not a resource name (plural)")
    has_selector, has_reference = "selector" in raw, "referencedBy" in raw
    if has_selector == has_reference:
        raise ConfigError(field, "give exactly one of selector and referencedBy")
    if has_selector:
        selector_raw = raw["selector"]
        if not isinstance(selector_raw, Mapping):
            raise ConfigError(f"{field}.selector", "must be a label selector")
        try:
            selector = Selector.from_label_selector(selector_raw, field=f"{field}.selector")
        except SelectorError as e:
            raise ConfigError(f"{field}.selector", e.message) from e
        if selector.is_empty:
            raise ConfigError(
                f"{field}.selector",
                "selects every object of the claimed resource; give matchLabels or "
                "matchExpressions",
            )
        return Rule(index, group, resource, selector=selector)
    ref = raw["referencedBy"]
    if not isinstance(ref, Mapping):
        raise ConfigError(f"{field}.referencedBy", "must be an object")
    unknown = set(ref) - {"path", "group", "version", "resource"}
    if unknown:
        raise ConfigError(f"{field}.referencedBy.{sorted(unknown)[0]}", "unknown field")
    text = _string(ref.get("path"), field=f"{field}.referencedBy.path")
    path = parse_path(text, field=f"{field}.referencedBy.path")
    src_group = _string(ref.get("group", ""), field=f"{field}.referencedBy.group")
    src_version = _string(ref.get("version", ""), field=f"{field}.referencedBy.version")
    src_resource = _string(ref.get("resource", ""), field=f"{field}.referencedBy.resource")
    if not src_resource or not _RESOURCE_RE.match(src_resource):
        raise ConfigError(
            f"{field}.referencedBy.resource",
            "must name the referencing resource of the export (plural, e.g. mongodbcommunity)",
        )
    if not src_version or not _RESOURCE_RE.match(src_version):
        raise ConfigError(
            f"{field}.referencedBy.version",
            "must name the version of the referencing resource (e.g. v1)",
        )
    if not _GROUP_RE.match(src_group):
        raise ConfigError(f"{field}.referencedBy.group", f"{src_group!r} is not an API group")
    reference = Reference(path, text, (src_group, src_resource), src_version)
    return Rule(index, group, resource, reference=reference)


def _string(value: object, *, field: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ConfigError(field, "must be a string")
    return value


def check_claims(
    rules: RelatedRules, *, claimed: Iterable[ClaimKey], exported: Iterable[ClaimKey]
) -> str | None:
    """Why the rules do not fit the export (a rule for a resource the export does not claim,
    a ``referencedBy`` from a resource it does not export), or None."""
    claimed_set, exported_set = frozenset(claimed), frozenset(exported)
    for rule in rules.rules:
        if rule.claim not in claimed_set:
            return (
                f"{rule.field}: the APIExport has no permission claim on "
                f"{_resource_name(*rule.claim)}"
            )
        ref = rule.reference
        if ref is not None and ref.source not in exported_set:
            return (
                f"{rule.field}.referencedBy: the APIExport exports no resource "
                f"{_resource_name(*ref.source)}"
            )
    return None


References = Mapping[ClaimKey, frozenset[str]]
"""What one referencing object names now, by claimed resource."""


def references_of(
    rules: RelatedRules, *, group: str, resource: str, obj: Mapping[str, Any]
) -> dict[ClaimKey, frozenset[str]]:
    """The names a decoded object of export resource (group, resource) references, by claimed
    resource, under ``rules`` (the caller passes it only when the object is visible through
    the slice)."""
    out: dict[ClaimKey, frozenset[str]] = {}
    for rule in rules.references_from(group, resource):
        assert rule.reference is not None
        names = names_at(obj, rule.reference.path)
        if names:
            out[rule.claim] = out.get(rule.claim, frozenset()) | names
    return out


@dataclass(frozen=True, slots=True)
class Transition:
    """A referenced object whose visibility by reference changed."""

    claim: ClaimKey
    key: ObjectKey
    visible: bool


class ReferenceIndex:
    """Who references what, for one slice (see the module docstring).

    ``_forward``: per referrer, the names it references by claimed resource (only non-empty
    entries are kept); ``_backward``: per (claimed resource, referenced object), its referrers.
    A referenced object is visible by reference iff its referrer set is non-empty."""

    __slots__ = ("_backward", "_forward")

    def __init__(self) -> None:
        self._forward: dict[ReferrerKey, References] = {}
        self._backward: dict[tuple[ClaimKey, ObjectKey], set[ReferrerKey]] = {}

    def update(self, referrer: ReferrerKey, refs: References) -> list[Transition]:
        """``referrer`` references exactly ``refs`` now (empty: nothing — it left the slice,
        is held by another slice, or is gone). Returns the referenced objects that became
        visible or invisible by reference; the work is the difference, never a scan."""
        old = self._forward.get(referrer, {})
        new = {claim: names for claim, names in refs.items() if names}
        if new == old:
            return []
        _, _, cluster, namespace, _ = referrer
        out: list[Transition] = []
        for claim in old.keys() | new.keys():
            before, after = old.get(claim, frozenset()), new.get(claim, frozenset())
            for name in before - after:
                k = (claim, (cluster, namespace, name))
                holders = self._backward[k]
                holders.discard(referrer)
                if not holders:
                    del self._backward[k]
                    out.append(Transition(claim, k[1], visible=False))
            for name in after - before:
                k = (claim, (cluster, namespace, name))
                holders = self._backward.setdefault(k, set())
                if not holders:
                    out.append(Transition(claim, k[1], visible=True))
                holders.add(referrer)
        if new:
            self._forward[referrer] = new
        else:
            self._forward.pop(referrer, None)
        return out

    def replace(
        self, entries: Iterable[tuple[ReferrerKey, References]], *, scope: ClaimKey | None = None
    ) -> list[Transition]:
        """The whole set of referrers now (a relist) — of the referencing resource ``scope``
        (group, resource; None: of every one): every such referrer not among ``entries``
        references nothing any more."""
        wanted = dict(entries)
        out: list[Transition] = []
        # Two passes, every new reference first (each referrer keeps its old ones too), then
        # the old ones dropped: an object another referrer names now stays visible throughout
        # (no DELETED and ADDED for it).
        for referrer, refs in wanted.items():
            old = self._forward.get(referrer, {})
            union = {
                c: old.get(c, frozenset()) | refs.get(c, frozenset())
                for c in old.keys() | refs.keys()
            }
            out.extend(self.update(referrer, union))
        for referrer, refs in wanted.items():
            out.extend(self.update(referrer, refs))
        for referrer in [
            r for r in self._forward if r not in wanted and (scope is None or (r[0], r[1]) == scope)
        ]:
            out.extend(self.update(referrer, {}))
        return out

    def referenced(self, claim: ClaimKey, key: ObjectKey) -> bool:
        return (claim, key) in self._backward

    def referrers(self, claim: ClaimKey, key: ObjectKey) -> frozenset[ReferrerKey]:
        return frozenset(self._backward.get((claim, key), ()))

    def references(self, referrer: ReferrerKey) -> References:
        return self._forward.get(referrer, {})

    def __len__(self) -> int:
        """Referenced objects (what the index costs)."""
        return len(self._backward)


def matching_rule(
    rules: Sequence[Rule],
    *,
    key: ObjectKey,
    labels: Mapping[str, str] | None,
    index: ReferenceIndex | None,
) -> Rule | None:
    """The first of one claimed resource's ``rules`` that makes the object visible, or None (no
    rule, nothing visible). ``index``: the slice's references (None: none known — a
    ``referencedBy`` rule then matches nothing, fail closed)."""
    for rule in rules:
        if rule.selector is not None:
            if rule.selector.matches(labels):
                return rule
        elif index is not None and index.referenced(rule.claim, key):
            return rule
    return None


def visible(
    rules: Sequence[Rule],
    *,
    key: ObjectKey,
    labels: Mapping[str, str] | None,
    index: ReferenceIndex | None,
) -> bool:
    """Whether a claimed object is visible through the slice (:func:`matching_rule`)."""
    return matching_rule(rules, key=key, labels=labels, index=index) is not None


def describe_rules(rules: Sequence[Rule]) -> str:
    """The rules of one claimed resource, for a 422 (or 'no rule' when there is none)."""
    if not rules:
        return f"no rule in {FIELD} shows this resource"
    return "; ".join(r.describe() for r in rules)


@dataclass(frozen=True, slots=True)
class ClaimedView:
    """How a slice's membership sees one claimed resource (:attr:`vwserver.holds.Member.
    claimed`): its rules and the slice's live reference index (None: not followed — a
    ``referencedBy`` rule then shows nothing). Claimed objects are never held by a slice: the
    handoff's holds are for the export's own resources."""

    claim: ClaimKey
    rules: tuple[Rule, ...]
    index: ReferenceIndex | None = field(default=None, compare=False)
    cluster: str = ""
    """The request's logical cluster (a write's body need not name it); ``*``: a wildcard
    read, where every object names its own."""

    def sees(self, key: ObjectKey | None, labels: Mapping[str, str] | None) -> bool:
        """Whether the object ``key`` (None: unknown — never visible) with ``labels`` is."""
        return key is not None and visible(self.rules, key=key, labels=labels, index=self.index)

    def rule_for(self, key: ObjectKey, labels: Mapping[str, str] | None) -> Rule | None:
        return matching_rule(self.rules, key=key, labels=labels, index=self.index)

    def describe(self) -> str:
        return describe_rules(self.rules)
