"""Related resources (vwserver.related): parsing the slice's rules, reference paths, the
reference index and the membership of claimed objects.

The property tests build random reference graphs — referencing objects that are visible
through the slice or not, naming random Secrets, changing over a random sequence of events —
and check the index against the definition: a claimed object is visible iff a visible object
references it (in its cluster and namespace) or it matches a selector rule.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.related_rules import SECRET_RULES
from vwserver.errors import ConfigError
from vwserver.related import (
    ReferenceIndex,
    ReferrerKey,
    Step,
    check_claims,
    describe_rules,
    matching_rule,
    names_at,
    parse_path,
    parse_rules,
    references_of,
    visible,
)

SECRETS = ("", "secrets")
CONFIGMAPS = ("", "configmaps")
MONGO = ("mongodbcommunity.mongodb.com", "mongodbcommunity")

MONGO_RULES = [
    {
        "resource": "secrets",
        "referencedBy": {
            "path": "spec.users[*].passwordSecretRef.name",
            "group": MONGO[0],
            "version": "v1",
            "resource": MONGO[1],
        },
    },
    {
        "resource": "configmaps",
        "referencedBy": {"path": "spec.configRef.name", "resource": "widgets", "version": "v1"},
    },
    {"resource": "secrets", "selector": {"matchLabels": {"region": "eu"}}},
]


def test_the_mongodb_rules_parse() -> None:
    rules = parse_rules(MONGO_RULES)
    assert rules.claims == {SECRETS, CONFIGMAPS}
    assert [r.index for r in rules.for_claim(*SECRETS)] == [0, 2]
    assert [r.index for r in rules.references_from(*MONGO)] == [0]
    assert [r.index for r in rules.references_from("", "widgets")] == [1]
    assert [s.collection_path for s in rules.sources()] == [
        "/apis/mongodbcommunity.mongodb.com/v1/mongodbcommunity",
        "/api/v1/widgets",
    ]
    assert "spec.relatedResources[0] (referencedBy" in describe_rules(rules.for_claim(*SECRETS))


@pytest.mark.parametrize(
    ("raw", "field", "problem"),
    [
        ("x", "spec.relatedResources", "must be a list"),
        ([{"resource": "secrets"}], "spec.relatedResources[0]", "exactly one of"),
        (
            [{"resource": "secrets", "selector": {}, "referencedBy": {"path": "a"}}],
            "spec.relatedResources[0]",
            "exactly one of",
        ),
        ([{"resource": "Secrets", "selector": {}}], "spec.relatedResources[0].resource", ""),
        ([{"group": "A_b", "resource": "x", "selector": {}}], "spec.relatedResources[0].group", ""),
        (
            [{"resource": "secrets", "selector": {}}],
            "spec.relatedResources[0].selector",
            "selects every object",
        ),
        (
            [{"resource": "secrets", "selector": {"matchLabels": {"a b": "c"}}}],
            "spec.relatedResources[0].selector",
            "",
        ),
        (
            [{"resource": "secrets", "referencedBy": {"path": ".spec.x"}}],
            "spec.relatedResources[0].referencedBy.path",
            "not a reference path",
        ),
        (
            [{"resource": "secrets", "referencedBy": {"path": "spec.x[0]"}}],
            "spec.relatedResources[0].referencedBy.path",
            "not a reference path",
        ),
        (
            [{"resource": "secrets", "referencedBy": {"path": "a", "group": "g.io"}}],
            "spec.relatedResources[0].referencedBy.resource",
            "must name the referencing resource",
        ),
        (
            [{"resource": "secrets", "referencedBy": {"path": "a", "resource": "dbs"}}],
            "spec.relatedResources[0].referencedBy.version",
            "must name the version",
        ),
        (
            [{"resource": "secrets", "referencedBy": {"path": "a", "names": "x"}}],
            "spec.relatedResources[0].referencedBy.names",
            "unknown field",
        ),
        ([{"resource": "secrets", "selector": {"matchLabels": {"a": "b"}}}] * 17, "", "at most"),
    ],
)
def test_invalid_rules_name_the_field(raw: Any, field: str, problem: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_rules(raw)
    assert e.value.field.startswith(field or "spec.relatedResources")
    assert problem in str(e.value)


def test_claims_must_be_the_exports() -> None:
    rules = parse_rules(MONGO_RULES)
    exported = [MONGO, ("", "widgets")]
    assert check_claims(rules, claimed=[SECRETS, CONFIGMAPS], exported=exported) is None
    problem = check_claims(rules, claimed=[SECRETS], exported=exported)
    assert problem is not None and "spec.relatedResources[1]" in problem and "configmaps" in problem
    problem = check_claims(rules, claimed=[SECRETS, CONFIGMAPS], exported=[])
    assert problem is not None and "referencedBy" in problem and "mongodbcommunity" in problem


def test_names_at_a_path() -> None:
    obj = {
        "spec": {
            "users": [
                {"passwordSecretRef": {"name": "alice-pw"}},
                {"passwordSecretRef": {"name": "Not A Name"}},
                {"passwordSecretRef": {"name": 3}},
                {"passwordSecretRef": None},
                "junk",
                {"passwordSecretRef": {"name": "bob-pw"}},
            ],
            "configRef": {"name": "cfg"},
        }
    }
    assert names_at(obj, parse_path("spec.users[*].passwordSecretRef.name", field="f")) == {
        "alice-pw",
        "bob-pw",
    }
    assert names_at(obj, parse_path("spec.configRef.name", field="f")) == {"cfg"}
    assert names_at(obj, parse_path("spec.configRef", field="f")) == frozenset()
    assert names_at(obj, parse_path("spec.users.name", field="f")) == frozenset()
    assert names_at({"spec": {"users": {"a": 1}}}, (Step("spec"), Step("users", each=True))) == (
        frozenset()
    )
    many = {"l": [f"n{i}" for i in range(500)]}
    assert len(names_at(many, (Step("l", each=True),))) == 64


def test_references_of_an_object() -> None:
    rules = parse_rules(MONGO_RULES)
    db = {
        "spec": {
            "users": [{"passwordSecretRef": {"name": "pw"}}],
            "configRef": {"name": "cfg"},
        }
    }
    assert references_of(rules, group=MONGO[0], resource=MONGO[1], obj=db) == {SECRETS: {"pw"}}
    # each rule reads its own resource: a widget's users name nothing
    assert references_of(rules, group="", resource="widgets", obj=db) == {CONFIGMAPS: {"cfg"}}


def test_index_transitions_and_shared_references() -> None:
    index = ReferenceIndex()
    a: ReferrerKey = (*MONGO, "c1", "ns", "a")
    b: ReferrerKey = (*MONGO, "c1", "ns", "b")
    pw = ("c1", "ns", "pw")
    t = index.update(a, {SECRETS: frozenset({"pw"})})
    assert [(x.key, x.visible) for x in t] == [(pw, True)]
    assert index.update(b, {SECRETS: frozenset({"pw"})}) == []  # shared: already visible
    assert index.update(a, {}) == []  # b still references it
    assert index.referrers(SECRETS, pw) == {b}
    t = index.update(b, {SECRETS: frozenset({"other"})})
    assert {(x.key, x.visible) for x in t} == {(pw, False), (("c1", "ns", "other"), True)}
    # another cluster or namespace is another object
    assert not index.referenced(SECRETS, ("c2", "ns", "other"))
    t = index.replace([])
    assert [(x.key, x.visible) for x in t] == [(("c1", "ns", "other"), False)]
    assert len(index) == 0


def test_membership_rule_that_matches() -> None:
    rules = parse_rules(MONGO_RULES).for_claim(*SECRETS)
    index = ReferenceIndex()
    key = ("c1", "ns", "pw")
    assert not visible(rules, key=key, labels=None, index=index)
    eu = matching_rule(rules, key=key, labels={"region": "eu"}, index=index)
    assert eu is not None and eu.index == 2
    index.update((*MONGO, "c1", "ns", "db"), {SECRETS: frozenset({"pw"})})
    ref = matching_rule(rules, key=key, labels={"region": "us"}, index=index)
    assert ref is not None and ref.index == 0
    assert not visible(rules, key=key, labels=None, index=None)  # no index: fail closed
    assert not visible((), key=key, labels={"region": "eu"}, index=index)  # no rule: nothing


# --- property tests over random reference graphs -------------------------------------------

CLUSTERS = ("c1", "c2")
NAMESPACES = ("a", "b")
SECRET_NAMES = ("s0", "s1", "s2", "s3")
REFERRERS = ("d0", "d1", "d2")

referrer_keys = st.tuples(
    st.just(MONGO[0]),
    st.just(MONGO[1]),
    st.sampled_from(CLUSTERS),
    st.sampled_from(NAMESPACES),
    st.sampled_from(REFERRERS),
)
# One event: a referencing object, whether it is visible through the slice now, what it names.
events = st.tuples(
    referrer_keys, st.booleans(), st.frozensets(st.sampled_from(SECRET_NAMES), max_size=3)
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(events, max_size=40),
    st.dictionaries(
        st.tuples(
            st.sampled_from(CLUSTERS), st.sampled_from(NAMESPACES), st.sampled_from(SECRET_NAMES)
        ),
        st.sampled_from(("eu", "us")),
    ),
)
def test_visible_iff_a_visible_object_references_it_or_the_selector_matches(
    history: list[tuple[ReferrerKey, bool, frozenset[str]]],
    secret_regions: dict[tuple[str, str, str], str],
) -> None:
    rules = parse_rules(SECRET_RULES)
    index = ReferenceIndex()
    state: dict[ReferrerKey, tuple[bool, frozenset[str]]] = {}
    by_transitions: set[tuple[str, str, str]] = set()  # what a watcher of transitions holds
    for referrer, is_visible, names in history:
        state[referrer] = (is_visible, names)
        obj = {"spec": {"users": [{"secret": n} for n in sorted(names)]}}
        refs = references_of(rules, group=MONGO[0], resource=MONGO[1], obj=obj)
        for t in index.update(referrer, refs if is_visible else {}):
            # transitions alternate per key: never ADDED twice nor DELETED what is not there
            assert (t.key in by_transitions) != t.visible
            (by_transitions.add if t.visible else by_transitions.discard)(t.key)
    expected_referenced = {
        (r[2], r[3], n) for r, (is_visible, names) in state.items() if is_visible for n in names
    }
    assert by_transitions == expected_referenced
    for cluster in CLUSTERS:
        for ns in NAMESPACES:
            for name in SECRET_NAMES:
                key = (cluster, ns, name)
                region = secret_regions.get(key)
                labels = {"region": region} if region else None
                expected = key in expected_referenced or region == "eu"
                assert (
                    visible(rules.for_claim(*SECRETS), key=key, labels=labels, index=index)
                    == expected
                )


@settings(max_examples=200, deadline=None)
@given(st.lists(events, max_size=30), st.lists(events, max_size=10))
def test_replace_equals_a_fresh_index(
    before: list[tuple[ReferrerKey, bool, frozenset[str]]],
    after: list[tuple[ReferrerKey, bool, frozenset[str]]],
) -> None:
    """A relist (replace) leaves the index as if built from the new list alone, and its
    transitions are exactly the difference."""
    old, fresh = ReferenceIndex(), ReferenceIndex()
    for referrer, is_visible, names in before:
        old.update(referrer, {SECRETS: names} if is_visible else {})
    was = {k for _, v in old._forward.items() for k in v}  # claims present (sanity)
    assert was <= {SECRETS}
    listing = {r: ({SECRETS: names} if v else {}) for r, v, names in after}
    held_before = set(old._backward)
    transitions = old.replace(listing.items())
    for referrer, refs in listing.items():
        fresh.update(referrer, refs)
    assert old._backward == fresh._backward
    assert old._forward == fresh._forward
    changed = {((t.claim, t.key), t.visible) for t in transitions}
    assert changed == {(k, False) for k in held_before - set(fresh._backward)} | {
        (k, True) for k in set(fresh._backward) - held_before
    }
