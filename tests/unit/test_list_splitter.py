"""ListSplitter: a list answer split as its bytes arrive decodes exactly as the whole answer.

Whatever the chunks and the batch size, the pages it returns (and the last one, from
``finish``) hold the entries :func:`decode_page` finds in the whole body, as the same bytes,
with the same metadata, and the list's fields wherever the upstream put them. The bodies are
written to trip a splitter that matched text rather than JSON: ``},{"`` and ``"items":[`` in
strings and in nested arrays of objects, keys before and after the entries.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import msgspec
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from vwserver.holds import HOLDS_ANNOTATION, Hold, Member, render_holds, slice_id
from vwserver.k8s.kcp import CLUSTER_ANNOTATION
from vwserver.proxy.filtering import (
    ANYWHERE,
    LabelMatcher,
    ListSplitter,
    Page,
    Scope,
    UndecodableError,
    decode_page,
    streamed_closing,
    streamed_opening,
)
from vwserver.selector import Selector

_TRICKY = ["},{", '},{"apiVersion":"x"', '"items":[', '"rows":[', "\\", '"', "]}", "{", "}"]

_text = st.one_of(st.sampled_from(_TRICKY), st.text(max_size=6))
_leaf = st.one_of(st.integers(), _text, st.none(), st.booleans())
_value = st.recursive(
    _leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_text, inner, max_size=3)),
    max_leaves=8,
)


@st.composite
def _objects(draw: st.DrawFn) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": draw(st.sampled_from(["a", "b", "c"])),
        "namespace": draw(st.sampled_from(["", "ns1", "ns2"])),
        "annotations": {"kcp.io/cluster": draw(st.sampled_from(["c1", "c2"]))},
        "labels": draw(st.dictionaries(st.sampled_from(["env", "x"]), _text, max_size=2)),
    }
    return {
        "apiVersion": "example.io/v1",
        "kind": "Widget",
        "metadata": meta,
        # nested arrays of objects: each ``},{`` between them is not an entry's end
        "spec": {"list": draw(st.lists(st.dictionaries(_text, _value, max_size=2), max_size=3))},
        "extra": draw(_value),
    }


def _body(items: list[dict[str, Any]], *, table: bool, typed: bool, rv: str) -> bytes:
    meta: dict[str, Any] = {"resourceVersion": rv}
    if table:
        rows = [{"cells": [i["metadata"]["name"]], "object": i} for i in items]
        doc: dict[str, Any] = {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta}
        doc["columnDefinitions"] = [{"name": "Name", "type": "string"}]
        doc["rows"] = rows
        return json.dumps(doc, separators=(",", ":")).encode()
    doc = {"kind": "WidgetList", "apiVersion": "example.io/v1", "metadata": meta, "items": items}
    # an unstructured list (a custom resource's) has its keys sorted: items before kind
    return json.dumps(doc, separators=(",", ":"), sort_keys=not typed).encode()


def _split(
    body: bytes, cuts: list[int], *, table: bool, size: int, scope: Scope, rest: bool
) -> list[Page]:
    splitter = ListSplitter(table=table, scope=scope, batch=size)
    pages: list[Page] = []
    points = sorted({c % (len(body) + 1) for c in cuts} | {0, len(body)})
    for start, end in itertools.pairwise(points):
        batch = splitter.feed(body[start:end])
        if batch is not None:
            pages.append(batch.page())
    if rest:
        batch = splitter.rest()
        if batch is not None:
            pages.append(batch.page())
    pages.append(splitter.finish())
    return pages


@settings(max_examples=300, deadline=None)
@given(
    items=st.lists(_objects(), max_size=6),
    table=st.booleans(),
    typed=st.booleans(),
    cuts=st.lists(st.integers(0, 10_000), max_size=8),
    batch=st.sampled_from([1, 7, 64, 10_000]),
    scope=st.sampled_from([ANYWHERE, Scope(cluster="c1"), Scope(namespace="ns1")]),
    rest=st.booleans(),
)
def test_split_answer_decodes_as_the_whole(
    items: list[dict[str, Any]],
    table: bool,
    typed: bool,
    cuts: list[int],
    batch: int,
    scope: Scope,
    rest: bool,
) -> None:
    body = _body(items, table=table, typed=typed, rv="42")
    whole = decode_page(body, table=table, scope=scope)
    pages = _split(body, cuts, table=table, size=batch, scope=scope, rest=rest)
    last = pages[-1]
    assert [bytes(e) for p in pages for e in p.entries] == [bytes(e) for e in whole.entries]
    assert [m for p in pages for m in p.metas] == whole.metas
    assert sum(p.out_of_scope for p in pages) == whole.out_of_scope
    assert (last.kind, last.api_version, last.resource_version, last.continue_token) == (
        whole.kind,
        whole.api_version,
        whole.resource_version,
        whole.continue_token,
    )
    assert last.column_definitions == whole.column_definitions


@settings(max_examples=100, deadline=None)
@given(
    items=st.lists(_objects(), max_size=4),
    table=st.booleans(),
    typed=st.booleans(),
    cuts=st.lists(st.integers(0, 10_000), max_size=6),
)
def test_streamed_response_is_the_list_with_its_fields(
    items: list[dict[str, Any]], table: bool, typed: bool, cuts: list[int]
) -> None:
    """The opening (fields before the entries), the entries and the closing (the fields
    after) make the list kcp sent, without ``remainingItemCount``."""
    body = _body(items, table=table, typed=typed, rv="7")
    splitter = ListSplitter(table=table, scope=ANYWHERE, batch=1)
    entries: list[bytes] = []
    opening = None
    points = sorted({c % (len(body) + 1) for c in cuts} | {0, len(body)})
    for start, end in itertools.pairwise(points):
        batch = splitter.feed(body[start:end])
        if batch is not None:
            opening = opening or splitter.head
            entries += [bytes(e) for e in batch.entries]
    batch = splitter.rest()
    if batch is not None:
        opening = opening or splitter.head
        entries += [bytes(e) for e in batch.entries]
    last = splitter.finish()
    entries += [bytes(e) for e in last.entries]
    head = opening or splitter.head
    assert head is not None
    written = (
        streamed_opening(head, table=table) + b",".join(entries) + streamed_closing(head, last)
    )
    assert msgspec.json.decode(written) == msgspec.json.decode(body)


def test_opening_and_closing_follow_the_upstream_key_order() -> None:
    body = _body([], table=False, typed=False, rv="9")
    splitter = ListSplitter(table=False, scope=ANYWHERE, batch=1)
    assert splitter.feed(body[:30]) is None
    assert splitter.feed(body[30:]) is None  # no entry to split off
    assert splitter.head is not None
    last = splitter.finish()
    assert (
        streamed_opening(splitter.head, table=False) == b'{"apiVersion":"example.io/v1","items":['
    )
    assert streamed_closing(splitter.head, last) == (
        b'],"kind":"WidgetList","metadata":{"resourceVersion":"9"}}\n'
    )


@pytest.mark.parametrize(
    ("body", "table"),
    [
        (b'{"apiVersion":"v1","items":[{"metadata":{}}],"kind":"Widget"}', False),
        (b'{"kind":"NotATable","rows":[{"object":null}]}', True),
        (b'{"apiVersion":"v1","items":[{"metadata":{}},{"metadata":', False),
        (b'{"kind":"WidgetList","items":[{"metadata":{}},{"metadata":{}}]', False),
    ],
    ids=["kind-not-a-list", "kind-not-a-table", "truncated-entry", "truncated-envelope"],
)
def test_a_wrong_or_broken_answer_is_undecodable(body: bytes, table: bool) -> None:
    def split() -> None:
        splitter = ListSplitter(table=table, scope=ANYWHERE, batch=1)
        for i in range(len(body)):
            batch = splitter.feed(body[i : i + 1])
            if batch is not None:
                batch.page()
        splitter.finish()

    with pytest.raises(UndecodableError):
        split()


def test_an_answer_without_the_entries_array_is_decoded_whole() -> None:
    """Whitespace between entries (no ``},{``) or no array at all: nothing is split off, the
    answer is decoded at its end."""
    body = b'{"kind":"WidgetList","items": [ {"metadata":{"name":"a"}} , {"metadata":{}} ]}'
    splitter = ListSplitter(table=False, scope=ANYWHERE, batch=1)
    assert all(splitter.feed(body[i : i + 1]) is None for i in range(len(body)))
    page = splitter.finish()
    assert [m.name for m in page.metas if m is not None] == ["a", ""]


_MINE, _OTHER = slice_id("c", "mine"), slice_id("c", "other")
_HOLDS = {
    "none": None,
    "mine": render_holds({_MINE: Hold(finalizers=("f/mine",))}),
    "mine-leaving": render_holds(
        {_MINE: Hold(finalizers=("f/mine",), leavingSince="2026-01-01T00:00:00Z")}
    ),
    "other": render_holds({_OTHER: Hold(finalizers=("f/other",))}),
    "garbage": "{not json",
}
_PROD = Selector.parse("env=prod")


@settings(max_examples=300, deadline=None)
@given(
    objects=st.lists(
        st.tuples(
            st.one_of(
                st.none(),
                st.dictionaries(
                    st.sampled_from(["env", "tier"]), st.sampled_from(["prod", "dev", "x"])
                ),
            ),
            st.sampled_from(list(_HOLDS)),
            st.sampled_from(["c1", "c2", None]),
            st.sampled_from(["ns1", "ns2", ""]),
        ),
        max_size=10,
    ),
    client=st.sampled_from(["", "tier=x", "env=prod", "env!=dev", "tier"]),
    with_slice=st.booleans(),
    with_member=st.booleans(),
    scope=st.sampled_from([ANYWHERE, Scope(cluster="c1"), Scope(namespace="ns1")]),
)
def test_batch_visible_is_the_page_visible(
    objects: list[tuple[dict[str, str] | None, str, str | None, str]],
    client: str,
    with_slice: bool,
    with_member: bool,
    scope: Scope,
) -> None:
    """What a batch shows, decided from the fields the decision reads (labels matched once per
    distinct set), is what its fully decoded page shows, and as many are out of scope."""
    member = Member(
        selector=_PROD,
        id=_MINE,
        peers=lambda sid: Selector.parse("env=dev") if sid == _OTHER else None,
    )
    items = []
    for i, (labels, held_by, cluster, namespace) in enumerate(objects):
        meta: dict[str, object] = {"name": f"o{i}", "namespace": namespace, "labels": labels}
        annotations = {}
        if _HOLDS[held_by] is not None:
            annotations[HOLDS_ANNOTATION] = _HOLDS[held_by]
            meta["finalizers"] = ["f/mine", "f/other"]
        if cluster is not None:
            annotations[CLUSTER_ANNOTATION] = cluster
        if annotations:
            meta["annotations"] = annotations
        items.append({"apiVersion": "v1", "kind": "Widget", "metadata": meta})
    body = json.dumps({"apiVersion": "v1", "items": items, "kind": "WidgetList"}).encode()
    body = body.replace(b", ", b",").replace(b": ", b":")
    splitter = ListSplitter(table=False, scope=scope, batch=1)
    batch = splitter.feed(body[:-40])
    assume(batch is not None)
    assert batch is not None
    selector = (_PROD & Selector.parse(client)) if with_slice else Selector.parse(client)
    matcher = LabelMatcher(selector)
    who = member if with_member else None
    page = batch.page()
    shown, outside = batch.visible(matcher, who)
    # joined with "," as the response writes them (all entries: one run of upstream bytes)
    assert b",".join(shown) == b",".join(page.visible(selector, who))
    assert outside == page.out_of_scope
    again, _ = batch.visible(matcher, who)  # the label sets now remembered
    assert b",".join(again) == b",".join(shown)
