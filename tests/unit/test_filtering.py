"""What may leave the proxy, object by object and event by event (vwserver.proxy.filtering)."""

from __future__ import annotations

import gc
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vwserver.holds import HOLDS_ANNOTATION, Hold, Member, render_holds, sees, slice_id
from vwserver.proxy.filtering import (
    LIST_FOOTER,
    Delivered,
    Scope,
    UndecodableError,
    decode_page,
    filter_event,
    list_header,
)
from vwserver.selector import Selector

PROD = Selector.parse("env=prod")


def widget(name: str, env: str, **extra: object) -> dict[str, object]:
    return {
        "apiVersion": "example.io/v1alpha1",
        "kind": "Widget",
        "metadata": {
            "name": name,
            "namespace": "ns1",
            "uid": f"uid-{name}",
            "resourceVersion": "42",
            "labels": {"env": env},
            "annotations": {"kcp.io/cluster": "c1", "secret-ish": "do not leak"},
        },
        "spec": {"size": 3, "password": "hunter2"},
        **extra,
    }


def event(kind: str, obj: dict[str, object]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


@pytest.mark.parametrize("kind", ["ADDED", "MODIFIED", "DELETED"])
def test_matching_events_pass_as_original_bytes(kind: str) -> None:
    line = event(kind, widget("a", "prod"))
    verdict = filter_event(line, PROD)
    assert verdict.forward  # the very same bytes go out, not a re-encoding
    assert verdict.replacement is None


def test_non_matching_added_is_dropped() -> None:
    verdict = filter_event(event("ADDED", widget("a", "dev")), PROD)
    assert not verdict.forward
    assert verdict.replacement is None


@pytest.mark.parametrize("kind", ["MODIFIED", "DELETED"])
def test_non_matching_event_of_a_never_delivered_object_is_dropped(kind: str) -> None:
    # A DELETED naming an object the watch never showed would tell the client it exists.
    delivered = Delivered()
    verdict = filter_event(event(kind, widget("a", "dev")), PROD, delivered=delivered)
    assert verdict == filter_event(event("ADDED", widget("a", "dev")), PROD)
    assert not verdict.forward and verdict.replacement is None
    assert not delivered.keys


@pytest.mark.parametrize("kind", ["MODIFIED", "DELETED"])
def test_non_matching_modified_or_deleted_becomes_minimal_deleted(kind: str) -> None:
    delivered = Delivered()
    assert filter_event(event("ADDED", widget("a", "prod")), PROD, delivered=delivered).forward
    assert delivered.keys == {"uid-a"}
    verdict = filter_event(event(kind, widget("a", "dev")), PROD, delivered=delivered)
    assert not delivered.keys  # shown deleted: a second one would name it again
    assert not verdict.forward
    assert verdict.replacement is not None
    out = json.loads(verdict.replacement)
    assert out == {
        "type": "DELETED",
        "object": {
            "apiVersion": "example.io/v1alpha1",
            "kind": "Widget",
            "metadata": {
                "name": "a",
                "namespace": "ns1",
                "uid": "uid-a",
                "resourceVersion": "42",
                "annotations": {"kcp.io/cluster": "c1"},
            },
        },
    }
    assert b"hunter2" not in verdict.replacement and b"dev" not in verdict.replacement


def test_bookmarks_and_errors_pass_unchanged() -> None:
    bookmark = event(
        "BOOKMARK",
        {
            "kind": "Widget",
            "apiVersion": "example.io/v1alpha1",
            "metadata": {
                "resourceVersion": "99",
                "annotations": {"k8s.io/initial-events-end": "true"},
            },
        },
    )
    assert filter_event(bookmark, PROD).forward
    error = event("ERROR", {"kind": "Status", "apiVersion": "v1", "code": 410, "reason": "Expired"})
    assert filter_event(error, PROD).forward


@pytest.mark.parametrize(
    "line", [b"not json\n", b'{"type":"ADDED"}\n', b'{"type":"WAT","object":{}}\n']
)
def test_garbage_events_raise(line: bytes) -> None:
    with pytest.raises(UndecodableError):
        filter_event(line, PROD)


def test_page_filtering_and_header() -> None:
    body = json.dumps(
        {
            "apiVersion": "example.io/v1alpha1",
            "kind": "WidgetList",
            "metadata": {"resourceVersion": "7", "continue": "tok", "remainingItemCount": 5},
            "items": [widget("a", "prod"), widget("b", "dev"), widget("c", "prod")],
        }
    ).encode()
    page = decode_page(body)
    visible = list(page.visible(PROD))
    assert [json.loads(bytes(v))["metadata"]["name"] for v in visible] == ["a", "c"]
    out = list_header(page, resource_version="7", continue_token="") + b",".join(visible)
    doc = json.loads(out + LIST_FOOTER)
    assert doc["metadata"] == {"resourceVersion": "7"}
    assert doc["kind"] == "WidgetList"
    assert len(doc["items"]) == 2


def test_table_rows_need_a_matching_object() -> None:
    body = json.dumps(
        {
            "apiVersion": "meta.k8s.io/v1",
            "kind": "Table",
            "metadata": {"resourceVersion": "7"},
            "columnDefinitions": [{"name": "Name", "type": "string"}],
            "rows": [
                {"cells": ["a"], "object": widget("a", "prod")},
                {"cells": ["b"], "object": widget("b", "dev")},
                {"cells": ["c"]},
            ],
        }
    ).encode()
    page = decode_page(body, table=True)
    assert page.is_table
    visible = [json.loads(bytes(v))["cells"][0] for v in page.visible(PROD)]
    assert visible == ["a"]
    # Even a selector that matches an object without labels never shows a row without one.
    for everything in (Selector(), Selector.parse("env!=dev")):
        shown = [json.loads(bytes(v))["cells"][0] for v in page.visible(everything)]
        assert shown == ["a"] if everything.requirements else ["a", "b"]
        assert page.shown_mask(everything)[2] is False
    header = list_header(page, resource_version="7", continue_token="c")
    doc = json.loads(header + b"]}")
    assert doc["columnDefinitions"] == [{"name": "Name", "type": "string"}]
    assert doc["metadata"] == {"resourceVersion": "7", "continue": "c"}


@pytest.mark.parametrize("enabled", [True, False])
def test_decode_page_leaves_the_garbage_collector_as_it_found_it(enabled: bool) -> None:
    """The collector is paused while a page is decoded, and is as it was afterwards — after an
    undecodable page too."""
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        body = json.dumps({"kind": "WidgetList", "items": [widget("a", "prod")]}).encode()
        assert [bytes(e) for e in decode_page(body).visible(PROD)] == [
            json.dumps(widget("a", "prod")).encode()
        ]
        assert gc.isenabled() is enabled
        with pytest.raises(UndecodableError):
            decode_page(b'{"kind": "WidgetList", "items": [')
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_non_list_is_rejected() -> None:
    with pytest.raises(UndecodableError):
        decode_page(json.dumps(widget("a", "prod")).encode())


def test_frame_events_forwards_runs_and_keeps_partial_lines() -> None:
    from vwserver.proxy.watch import frame_events

    a, b, c = (
        event("MODIFIED", widget(n, e)) for n, e in (("a", "prod"), ("b", "dev"), ("c", "prod"))
    )
    partial = event("ADDED", widget("d", "prod"))[:20]
    buffer = bytearray(a + b + c + partial)
    delivered = Delivered(keys={"uid-b"})  # b was shown earlier by this watch
    framed = frame_events(buffer, selector=PROD, delivered=delivered)
    out, consumed = framed.out, framed.consumed
    forwarded, dropped, synthesized = framed.forwarded, framed.dropped, framed.synthesized
    assert consumed == len(a + b + c)
    assert (forwarded, dropped, synthesized) == (2, 0, 1)  # the partial line is not counted yet
    lines = out.splitlines(keepends=True)
    assert lines[0] == a
    assert json.loads(lines[1])["type"] == "DELETED"  # b left the slice: minimal DELETED
    assert b"spec-of" not in lines[1] and b"hunter2" not in lines[1]
    assert lines[2] == c


def test_frame_events_counts_each_outcome_and_skips_keepalives() -> None:
    from vwserver.proxy.watch import frame_events

    bookmark = event("BOOKMARK", {"kind": "Widget", "metadata": {"resourceVersion": "9"}})
    lines = [
        event("ADDED", widget("a", "dev")),  # never visible: dropped
        b"\n",  # an empty keep-alive line is no event
        bookmark,
        event("ADDED", widget("b", "prod")),
        event("DELETED", widget("c", "dev")),  # synthesized: identifying metadata only
        event("MODIFIED", widget("d", "dev")),  # never delivered: dropped
        event(
            "ADDED",
            widget("e", "prod")
            | {
                "metadata": {
                    "name": "e",
                    "labels": {"env": "prod"},
                    "annotations": {"kcp.io/cluster": "c2"},
                }
            },
        ),  # another logical cluster: out of scope
    ]
    framed = frame_events(
        bytearray(b"".join(lines)),
        selector=PROD,
        scope=Scope(cluster="c1"),
        delivered=Delivered(keys={"uid-c"}),
    )
    assert (framed.forwarded, framed.dropped, framed.synthesized) == (2, 3, 1)
    assert framed.out_of_scope == 1
    assert framed.consumed == len(b"".join(lines))
    # the keep-alive line is passed on with the run of bytes it is in, uncounted
    assert framed.out.startswith(b"\n" + bookmark + lines[3])


def table_event(kind: str, obj: dict[str, object] | None) -> bytes:
    row: dict[str, object] = {"cells": ["a", "1s"]}
    if obj is not None:
        row["object"] = obj
    table = {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {}, "rows": [row]}
    return event(kind, table)


def test_table_events_are_matched_on_the_row_object() -> None:
    # A selector that matches unlabelled bodies must not let a Table through on its own
    # (empty) labels: the row's object is what counts.
    not_dev = Selector.parse("env notin (dev)")
    assert filter_event(table_event("ADDED", widget("a", "prod")), not_dev, table=True).forward
    assert not filter_event(table_event("ADDED", widget("a", "dev")), not_dev, table=True).forward
    assert not filter_event(table_event("ADDED", None), not_dev, table=True).forward  # never


def test_a_table_event_that_leaves_becomes_a_table_deleted_naming_only_the_object() -> None:
    delivered = Delivered()
    assert filter_event(
        table_event("ADDED", widget("a", "prod")), PROD, table=True, delivered=delivered
    ).forward
    never = filter_event(table_event("MODIFIED", widget("b", "dev")), PROD, table=True)
    assert not never.forward and never.replacement is None
    verdict = filter_event(
        table_event("MODIFIED", widget("a", "dev")), PROD, table=True, delivered=delivered
    )
    assert verdict.replacement is not None
    out = json.loads(verdict.replacement)
    assert out["type"] == "DELETED" and out["object"]["kind"] == "Table"
    (row,) = out["object"]["rows"]
    assert row["cells"] == ["a"]
    assert "spec" not in row["object"] and "labels" not in row["object"]["metadata"]
    assert b"hunter2" not in verdict.replacement and b"do not leak" not in verdict.replacement


def test_strip_objects_keeps_rows_without_objects() -> None:
    verdict = filter_event(
        table_event("ADDED", widget("a", "prod")), PROD, table=True, strip_objects=True
    )
    assert verdict.replacement is not None
    assert json.loads(verdict.replacement)["object"]["rows"][0]["object"] is None


def test_a_watch_from_a_resource_version_asks_about_objects_the_client_may_hold() -> None:
    from vwserver.proxy.filtering import settle
    from vwserver.proxy.watch import frame_events

    delivered = Delivered(since="41")  # the client's state came from a LIST at 41
    before = event("ADDED", widget("p", "prod"))
    hidden = event("MODIFIED", widget("a", "dev"))
    after = event("ADDED", widget("q", "prod"))
    buffer = bytearray(before + hidden + after)
    framed = frame_events(buffer, selector=PROD, delivered=delivered)
    # framing stops before the event that needs the answer; what came before goes out
    assert framed.out == before and framed.consumed == len(before)
    assert framed.asking is not None and framed.asking_length == len(hidden)
    shown = settle(framed.asking, visible_before={"uid-a"}, delivered=delivered)
    assert shown.replacement is not None and json.loads(shown.replacement)["type"] == "DELETED"
    # asked once per object: a later event of it is decided without asking
    again = filter_event(hidden, PROD, delivered=delivered)
    assert again == filter_event(event("ADDED", widget("a", "dev")), PROD)
    # an object the LIST did not show gets nothing
    other = filter_event(event("DELETED", widget("b", "dev")), PROD, delivered=delivered)
    assert other.ask
    assert settle(other, visible_before=set(), delivered=delivered).replacement is None
    # kcp's ADDED means the object did not match just before: never asked about
    assert not filter_event(event("ADDED", widget("c", "dev")), PROD, delivered=delivered).ask
    # without a starting resourceVersion the watch sent the whole state: nothing to ask
    assert not filter_event(hidden, PROD, delivered=Delivered()).ask


_LABEL_VALUES = st.sampled_from(["prod", "dev", "x"])


@given(
    objects=st.lists(
        st.tuples(
            st.dictionaries(st.sampled_from(["env", "tier"]), _LABEL_VALUES, max_size=2),
            st.sampled_from(["none", "mine", "mine-leaving", "other", "garbage"]),
        ),
        max_size=8,
    ),
    client=st.sampled_from(["", "tier=x", "env=prod", "env!=dev", "tier"]),
    with_slice=st.booleans(),
)
def test_page_visible_is_selector_and_membership(
    objects: list[tuple[dict[str, str], str]], client: str, with_slice: bool
) -> None:
    """Page.visible skips the membership rule's second match of an object no slice holds
    when the selector already includes the slice's: the result is the whole rule's."""
    mine, other = slice_id("c", "mine"), slice_id("c", "other")
    holds = {
        "none": None,
        "mine": render_holds({mine: Hold(finalizers=("f/mine",))}),
        "mine-leaving": render_holds(
            {mine: Hold(finalizers=("f/mine",), leavingSince="2026-01-01T00:00:00Z")}
        ),
        "other": render_holds({other: Hold(finalizers=("f/other",))}),
        "garbage": "{not json",
    }
    member = Member(
        selector=PROD,
        id=mine,
        peers=lambda sid: Selector.parse("env=dev") if sid == other else None,
    )
    items = []
    for i, (labels, held_by) in enumerate(objects):
        meta: dict[str, object] = {"name": f"o{i}", "labels": labels}
        if holds[held_by] is not None:
            meta["annotations"] = {HOLDS_ANNOTATION: holds[held_by]}
            meta["finalizers"] = ["f/mine", "f/other"]
        items.append({"apiVersion": "v1", "kind": "Widget", "metadata": meta})
    body = json.dumps({"apiVersion": "v1", "kind": "WidgetList", "metadata": {}, "items": items})
    page = decode_page(body.encode())
    selector = (PROD & Selector.parse(client)) if with_slice else Selector.parse(client)
    expected = [
        entry
        for entry, meta in zip(page.entries, page.metas, strict=True)
        if meta is not None
        and selector.matches(meta.labels)
        and sees(
            member, labels=meta.labels, annotations=meta.annotations, finalizers=meta.finalizers
        )
    ]
    assert [bytes(e) for e in page.visible(selector, member)] == [bytes(e) for e in expected]
    assert [bytes(e) for e in page.visible(selector)] == [
        bytes(e)
        for e, m in zip(page.entries, page.metas, strict=True)
        if m is not None and selector.matches(m.labels)
    ]
