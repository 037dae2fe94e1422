"""Who sees what (vwserver.cache.views): membership, a client's own selectors, watch
transitions, and the field-selector grammar of the apiserver.

The central property is the informer invariant: for random histories (tests/unit/
test_cache_store.py builds them), random slice selectors and random client filters (cluster,
namespace, labelSelector, fieldSelector), a client that starts from the visible part of
``state_at(R)`` for any R in the window and applies the transitions of ``changes_since(R)`` in
order holds exactly the visible part of the state after each change — no event is missing,
none is extra (an ADDED for something it holds, a DELETED for something it does not) — and no
event ever carries content the client was not allowed to see: ADDED/MODIFIED carry a visible
version, DELETED the version the client holds, at the change's resourceVersion.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.holds_model import slice_members
from tests.unit.test_cache_store import (
    KEYS,
    Labels,
    Op,
    by_key,
    history,
    initial_strategy,
    make,
    obj,
    ops_strategy,
    rewritten,
)
from vwserver.cache.entries import Change, Entry, Meta, entry
from vwserver.cache.store import Store
from vwserver.cache.views import (
    EVERYTHING,
    ClientFilter,
    FieldRequirement,
    FieldSelector,
    FieldSelectorError,
    SliceView,
    _split_term,
    _split_terms,
    _unescape,
    accepts,
    departed,
    escape_field_value,
    leaving,
    parse_field_selector,
    pending,
    transition,
    visible,
    with_resource_version,
)
from vwserver.controller.handoff import decide
from vwserver.errors import BadRequest
from vwserver.holds import HOLDS_ANNOTATION, as_leaving, effective_holds, plan_write
from vwserver.selector import Selector

SLICES = ["env=prod", "env!=dev", "region in (eu)", "!env", "", "env=prod,region=eu"]
LABELS = ["", "region=us", "env", "env notin (prod)"]
FIELDS = [
    "",
    "metadata.name=x",
    "metadata.namespace!=a",
    "metadata.name!=y,metadata.namespace=b",
    "metadata.name==z",
]


def without_rv(raw: bytes) -> Any:
    doc = json.loads(raw)
    doc["metadata"].pop("resourceVersion", None)
    return doc


clients = st.builds(
    lambda cluster, namespace, labels, fields: ClientFilter(
        cluster=cluster,
        namespace=namespace,
        labels=Selector.parse(labels),
        fields=parse_field_selector(fields),
    ),
    st.sampled_from(["*", "c1", "c2"]),
    st.sampled_from([None, "a", "b"]),
    st.sampled_from(LABELS),
    st.sampled_from(FIELDS),
)
views = st.builds(lambda s: SliceView(selector=Selector.parse(s)), st.sampled_from(SLICES))


@settings(max_examples=400, deadline=None)
@given(
    initial=initial_strategy,
    ops=ops_strategy,
    window=st.integers(1, 12),
    view=views,
    client=clients,
)
def test_the_informer_invariant(
    initial: dict[tuple[str, str, str], Labels],
    ops: list[Op],
    window: int,
    view: SliceView,
    client: ClientFilter,
) -> None:
    h = history(initial, ops, window=window)
    store = h.store
    accept = accepts(view, client)
    for start in range(store.oldest_rv, store.rv + 1):
        held = {e.key: e for e in store.state_at(start) if accept(e)}
        assert list(held.values()) == by_key(h.at(start), accept)
        for change in store.changes_since(start):
            for kind, sent in transition(view=view, client=client, change=change):
                assert sent.meta.resource_version == change.rv
                assert json.loads(sent.raw)["metadata"]["resourceVersion"] == str(change.rv)
                if kind == "DELETED":
                    assert change.key in held
                    assert without_rv(sent.raw) == without_rv(held.pop(change.key).raw)
                else:
                    assert (kind == "MODIFIED") == (change.key in held), kind
                    assert sent is change.new and accept(sent)
                    held[change.key] = sent
            # after every change, not only at the end
            assert list(held[k] for k in sorted(held)) == by_key(h.at(change.rv), accept)
        assert list(held[k] for k in sorted(held)) == [e for e in store.snapshot() if accept(e)]


def test_transitions_one_by_one() -> None:
    view = SliceView(selector=Selector.parse("env=prod"))
    client = ClientFilter()
    key = KEYS[0]
    prod, dev = make(key, {"env": "prod"}, 5), make(key, {"env": "dev"}, 6)
    prod2 = make(key, {"env": "prod"}, 7, spec=2)

    def change(prev: Entry | None, new: Entry | None, rv: int, **kw: Any) -> Change:
        kind = "DELETED" if new is None else "MODIFIED" if prev else "ADDED"
        return Change(kind, rv, prev, new, **kw)  # type: ignore[arg-type]

    assert transition(view=view, client=client, change=change(None, prod, 5)) == (("ADDED", prod),)
    assert transition(view=view, client=client, change=change(None, dev, 6)) == ()
    assert transition(view=view, client=client, change=change(dev, prod2, 7)) == (("ADDED", prod2),)
    assert transition(view=view, client=client, change=change(prod, prod2, 7)) == (
        ("MODIFIED", prod2),
    )
    left = change(prod, dev, 6)
    ((kind, sent),) = transition(view=view, client=client, change=left)
    assert kind == "DELETED"
    assert json.loads(sent.raw)["metadata"]["labels"] == {"env": "prod"}  # the previous content
    assert sent.meta.resource_version == 6 and sent.meta.labels == {"env": "prod"}
    # a second client gets the very same entry (built once per change)
    other = ClientFilter(cluster="c1")
    assert transition(view=view, client=other, change=left) == (("DELETED", sent),)
    # neither version passes: nothing
    assert transition(view=view, client=client, change=change(dev, None, 8)) == ()


def test_a_deletion_carries_the_upstreams_object_when_it_is_the_previous_version() -> None:
    view = SliceView(selector=Selector.parse("env=prod"))
    prev = make(KEYS[0], {"env": "prod"}, 5)
    gone = rewritten(prev, 9)
    change = Change("DELETED", 9, prev, None, deleted=gone)
    assert transition(view=view, client=ClientFilter(), change=change) == (("DELETED", gone),)


def test_a_deletion_never_carries_content_the_client_did_not_see() -> None:
    """An upstream whose DELETED object differs from the version it sent last (it never
    should): the client gets the version it saw, at the deletion's resourceVersion."""
    view = SliceView(selector=Selector.parse("env=prod"))
    prev = make(KEYS[0], {"env": "prod"}, 5)
    odd = make(KEYS[0], {"env": "dev", "secret": "yes"}, 9)
    change = Change("DELETED", 9, prev, None, deleted=odd)
    ((kind, sent),) = transition(view=view, client=ClientFilter(), change=change)
    assert kind == "DELETED" and sent is not odd
    assert without_rv(sent.raw) == without_rv(prev.raw) and sent.meta.resource_version == 9
    assert departed(change) is sent


def test_with_resource_version_rewrites_only_that_member() -> None:
    raw = (
        b'{"kind":"W","metadata":{"name":"x","resourceVersion":"5","uid":"u"},"spec":{"a":[1,2.5]}}'
    )
    assert (
        with_resource_version(entry(raw), 12)
        == b'{"kind":"W","metadata":{"name":"x","resourceVersion":"12","uid":"u"},'
        b'"spec":{"a":[1,2.5]}}'
    )


def meta(*, name: str = "x", namespace: str = "a", cluster: str = "c1", **labels: str) -> Meta:
    return Meta(
        cluster=cluster,
        namespace=namespace,
        name=name,
        resource_version=1,
        labels=labels,
        annotations={},
        finalizers=(),
        deletion_timestamp=None,
    )


def test_membership_and_client_filter() -> None:
    view = SliceView(selector=Selector.parse("env=prod"))
    assert visible(view, meta(env="prod")) and not visible(view, meta(env="dev"))
    assert not visible(view, meta())
    client = ClientFilter(
        cluster="c2",
        namespace="b",
        labels=Selector.parse("region=eu"),
        fields=parse_field_selector("metadata.name!=y"),
    )
    assert client.matches(meta(cluster="c2", namespace="b", name="x", region="eu"))
    for wrong in (
        meta(cluster="c1", namespace="b", name="x", region="eu"),
        meta(cluster="c2", namespace="a", name="x", region="eu"),
        meta(cluster="c2", namespace="b", name="y", region="eu"),
        meta(cluster="c2", namespace="b", name="x", region="us"),
    ):
        assert not client.matches(wrong)
    assert ClientFilter().matches(meta())


# --- the field-selector grammar (k8s.io/apimachinery/pkg/fields, its tests' cases) -------------


@pytest.mark.parametrize(
    ("text", "terms"),
    [
        ("a", ["a"]),
        ("a=avalue", ["a=avalue"]),
        ("a=avalue,b=bvalue", ["a=avalue", "b=bvalue"]),
        ("a=avalue,b==bvalue,c!=cvalue", ["a=avalue", "b==bvalue", "c!=cvalue"]),
        ("", []),
        ("a=a,", ["a=a", ""]),
        (",a=a", ["", "a=a"]),
        (r"k=\,,k2=v2", [r"k=\,", "k2=v2"]),
        (r"k=\\,k2=v2", [r"k=\\", "k2=v2"]),
        (r"k=\\\,,k2=v2", [r"k=\\\,", "k2=v2"]),
        (r"k=\a\b\\", [r"k=\a\b\\"]),
        ("k=\\", ["k=\\"]),
        ("함=수,목=록", ["함=수", "목=록"]),
    ],
)
def test_split_terms(text: str, terms: list[str]) -> None:
    assert _split_terms(text) == terms


@pytest.mark.parametrize(
    ("term", "split"),
    [
        ("a=value", ("a", "=", "value")),
        ("b==value", ("b", "==", "value")),
        ("c!=value", ("c", "!=", "value")),
        ("", None),
        ("a", None),
        (r"k=\,", ("k", "=", r"\,")),
        (r"k=\=", ("k", "=", r"\=")),
        ("k=\\\\\\a\\b\\=\\,\\", ("k", "=", "\\\\\\a\\b\\=\\,\\")),
        ("함=수", ("함", "=", "수")),
    ],
)
def test_split_term(term: str, split: tuple[str, str, str] | None) -> None:
    assert _split_term(term) == split


@pytest.mark.parametrize(
    ("plain", "escaped"),
    [
        ("", ""),
        ("a", "a"),
        ("=", r"\="),
        (",", r"\,"),
        ("\\", "\\\\"),
        (r"\=\,\\", r"\\\=\\\,\\\\"),
    ],
)
def test_escape_and_unescape(plain: str, escaped: str) -> None:
    assert escape_field_value(plain) == escaped
    assert _unescape(escaped) == plain


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("\\", "invalid field selector: invalid escape sequence: \\"),
        ("\\\\\\", "invalid field selector: invalid escape sequence: \\"),
        ("\\a", "invalid field selector: invalid escape sequence: \\a"),
        ("a=b", "invalid field selector: unescaped character in value: 61"),
    ],
)
def test_bad_escapes(value: str, message: str) -> None:
    with pytest.raises(FieldSelectorError) as caught:
        _unescape(value)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("text", "requirements"),
    [
        ("", []),
        (",", []),
        ("metadata.name=x", [("metadata.name", True, "x")]),
        ("metadata.name==x", [("metadata.name", True, "x")]),
        ("metadata.name!=x", [("metadata.name", False, "x")]),
        ("metadata.name=", [("metadata.name", True, "")]),
        (r"metadata.name=a\,b\=c\\", [("metadata.name", True, "a,b=c\\")]),
        (
            "metadata.namespace=ns,metadata.name!=y",  # sorted like ParseSelector sorts
            [("metadata.name", False, "y"), ("metadata.namespace", True, "ns")],
        ),
    ],
)
def test_parse(text: str, requirements: list[tuple[str, bool, str]]) -> None:
    parsed = parse_field_selector(text)
    assert parsed == FieldSelector(tuple(FieldRequirement(*r) for r in requirements))
    assert parse_field_selector(parsed.render()) == parsed  # render() is parseable again


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("metadata.name", "invalid selector: 'metadata.name'; can't understand 'metadata.name'"),
        (
            "metadata.name=a,b",
            "invalid selector: 'metadata.name=a,b'; can't understand 'b'",
        ),
        (
            "metadata.name in (a)",
            "invalid selector: 'metadata.name in (a)'; can't understand 'metadata.name in (a)'",
        ),
        ("metadata.name=a||b=c", "invalid field selector: unescaped character in value: 61"),
        ("metadata.name==a==b", "invalid field selector: unescaped character in value: 61"),
        (r"metadata.name=\a", "invalid field selector: invalid escape sequence: \\a"),
        ("spec.size=1", "field label not supported: spec.size"),
        ("status.phase=x,metadata.name=y", "field label not supported: status.phase"),
        ("z.z=1,a.a=2", "field label not supported: a.a"),  # the first in sorted order
        ("spec.size=1,bad", "invalid selector: 'spec.size=1,bad'; can't understand 'bad'"),
        (" metadata.name=x", "field label not supported:  metadata.name"),  # no trimming
    ],
)
def test_refused(text: str, message: str) -> None:
    with pytest.raises(FieldSelectorError) as caught:
        parse_field_selector(text)
    assert str(caught.value) == message
    assert isinstance(caught.value, BadRequest) and caught.value.code == 400


def test_cluster_scoped_resources_have_no_namespace_field() -> None:
    assert (
        parse_field_selector("metadata.name=x", namespaced=False).requires("metadata.name") == "x"
    )
    with pytest.raises(FieldSelectorError, match=r"field label not supported: metadata\.namespace"):
        parse_field_selector("metadata.namespace=a", namespaced=False)


def test_field_selector_matching() -> None:
    assert EVERYTHING.matches(meta()) and EVERYTHING.empty
    assert parse_field_selector("metadata.name=x,metadata.namespace=a").matches(meta())
    assert not parse_field_selector("metadata.name=x,metadata.namespace!=a").matches(meta())
    assert parse_field_selector("metadata.namespace=").matches(meta(namespace=""))
    assert parse_field_selector("metadata.name!=").matches(meta())
    selector = parse_field_selector("metadata.namespace=ns")
    assert selector.requires("metadata.namespace") == "ns"
    assert selector.requires("metadata.name") is None
    assert dataclasses.replace(selector).render() == "metadata.namespace=ns"


# --- the handoff, as a watch and a LIST of the holding slice show it ------------------------------

PROD = "ws/prod"
DEV = "ws/dev"
SLICE_SELECTORS = {PROD: Selector.parse("env=prod"), DEV: Selector.parse("env=dev")}
HELD_KEY = KEYS[0]


def held_entry(
    rv: int, labels: Labels, finalizers: list[str], holds: str | None, spec: int
) -> Entry:
    doc = obj(HELD_KEY, labels, rv, spec=spec)
    if finalizers:
        doc["metadata"]["finalizers"] = finalizers
    if holds is not None:
        doc["metadata"]["annotations"][HOLDS_ANNOTATION] = holds
    return entry(json.dumps(doc).encode())


slice_view = slice_members(SLICE_SELECTORS)


def holds_after(view: SliceView, meta: Meta, finalizers: list[str], *, record: bool) -> str | None:
    """The holds annotation the proxy writes with ``finalizers`` through ``view`` (no relabel)."""
    return plan_write(
        view,
        stored_labels=meta.labels,
        stored_annotations=meta.annotations,
        stored_finalizers=meta.finalizers,
        result_labels=meta.labels,
        result_finalizers=finalizers,
        record=record,
    ).annotation


def shown_doc(view: SliceView, item: Entry) -> Any:
    since = leaving(view, item.meta)
    raw = item.raw if since is None else as_leaving(item.raw, since, now=lambda: "provisional")
    return json.loads(raw)


handoff_ops = st.lists(
    st.one_of(
        st.tuples(st.just("relabel"), st.sampled_from(["prod", "dev", "x"])),
        st.tuples(st.just("adopt"), st.sampled_from([PROD, DEV])),
        st.tuples(st.just("release"), st.sampled_from([PROD, DEV])),
        st.tuples(st.just("scan"), st.just("")),
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(ops=handoff_ops, selective=st.booleans())
def test_a_holding_slice_never_sees_its_object_outside_its_selector_without_a_deletion(
    ops: list[tuple[str, str]], selective: bool
) -> None:
    """Random relabels, adoptions (a finalizer added through a slice), releases and handoff
    scans of one object. For every client of every slice — also one whose own labelSelector is
    the slice's label (controller-runtime's ByObject) — at every resourceVersion:

    * LIST: an object shown outside the slice's selector carries a deletionTimestamp;
    * WATCH: every ADDED/MODIFIED likewise; once a client was shown the object being deleted,
      it is never shown it again without a deletion before a DELETED (monotonic deletion);
    * a watch that starts from any LIST holds, after each change, what that LIST would show —
      except a version leaving the slice before its move is recorded, which is held back
      (the client keeps the version before it);
    * a client of the slice that holds a leaving object sees it, whatever its own selector.
    """
    store = Store(window=64)
    rv, spec = 1, 0
    labels: Labels = {"env": "prod"}
    finalizers: list[str] = []
    holds: str | None = None
    store.replace([held_entry(rv, labels, finalizers, holds, spec)], rv)

    def put() -> None:
        nonlocal rv, spec
        rv += 1
        spec += 1
        store.apply("MODIFIED", held_entry(rv, labels, finalizers, holds, spec))

    for op, arg in ops:
        current = store.get(HELD_KEY)
        assert current is not None
        meta_now = current.meta
        if op == "relabel":
            labels = {"env": arg}
        elif op == "adopt":
            view = slice_view(arg)
            if not visible(view, meta_now) or leaving(view, meta_now) is not None:
                continue
            holds = holds_after(view, meta_now, [*finalizers, f"{arg}/f"], record=True)
            finalizers = [*finalizers, f"{arg}/f"]
        elif op == "release":
            view = slice_view(arg)
            if f"{arg}/f" not in finalizers or not visible(view, meta_now):
                continue
            rest = [f for f in finalizers if f != f"{arg}/f"]
            finalizers, holds = rest, holds_after(view, meta_now, rest, record=False)
        else:
            decision = decide(
                labels=dict(meta_now.labels),
                annotations=dict(meta_now.annotations),
                finalizers=meta_now.finalizers,
                selector_of=SLICE_SELECTORS.get,
                timeout_of=lambda _sid: None,
                now=datetime(2026, 12, 1, tzinfo=UTC),
                labels_before=lambda _sid, selector: (
                    found.meta.labels
                    if (
                        found := store.last_version(
                            HELD_KEY, lambda e: selector.matches(e.meta.labels)
                        )
                    )
                    else None
                ),
            )
            if decision is None:
                continue
            holds = decision.holds
        put()

    for sid in SLICE_SELECTORS:
        view = slice_view(sid)
        own = SLICE_SELECTORS[sid]
        filters = [ClientFilter(), *([ClientFilter(labels=own)] if selective else [])]
        for client in filters:
            accept = accepts(view, client)
            for start in range(store.oldest_rv, store.rv + 1):
                listed = {e.key: e for e in store.state_at(start) if accept(e)}
                for item in listed.values():
                    doc = shown_doc(view, item)
                    assert own.matches(doc["metadata"].get("labels")) or doc["metadata"].get(
                        "deletionTimestamp"
                    ), (sid, doc)
                held = {k: shown_doc(view, e) for k, e in listed.items()}
                deleting = {k for k, d in held.items() if d["metadata"].get("deletionTimestamp")}
                for change in store.changes_since(start):
                    for kind, sent in transition(view=view, client=client, change=change):
                        doc = shown_doc(view, sent)
                        if kind == "DELETED":
                            assert change.key in held
                            held.pop(change.key)
                            deleting.discard(change.key)
                            continue
                        assert (kind == "MODIFIED") == (change.key in held), kind
                        being_deleted = bool(doc["metadata"].get("deletionTimestamp"))
                        assert own.matches(doc["metadata"]["labels"]) or being_deleted, doc
                        if change.key in deleting:
                            assert being_deleted, f"{sid}: the deletionTimestamp went away"
                        held[change.key] = doc
                        if being_deleted:
                            deleting.add(change.key)
                    assert change.new is not None
                    new = change.new
                    if accept(new) and not pending(view, new.meta):
                        assert held.get(change.key) == shown_doc(view, new)
                    elif not accept(new):
                        assert change.key not in held
                    if (
                        effective_holds(new.meta.annotations, new.meta.finalizers).get(sid)
                        is not None
                    ):
                        assert change.key in held, f"{sid} holds it but its client lost it"
