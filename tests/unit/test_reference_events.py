"""The pure parts of the watch events for claimed objects (vwserver.proxy.reference_events) and
the Table columns a watch carries over a dropped first event (vwserver.proxy.watch.Columns)."""

from __future__ import annotations

import json

from vwserver.holds import Member
from vwserver.proxy.filtering import Scope
from vwserver.proxy.reference_events import event_line, in_scope, object_meta
from vwserver.proxy.watch import Columns, frame_events
from vwserver.related import ClaimedView, Transition, parse_rules
from vwserver.selector import Selector

SECRETS = ("", "secrets")


def test_in_scope() -> None:
    t = Transition(SECRETS, ("c1", "ns", "pw"), visible=True)
    assert in_scope(t, claim=SECRETS, scope=Scope())
    assert in_scope(t, claim=SECRETS, scope=Scope(cluster="c1", namespace="ns", name="pw"))
    assert not in_scope(t, claim=("", "configmaps"), scope=Scope())
    assert not in_scope(t, claim=SECRETS, scope=Scope(cluster="c2"))
    assert not in_scope(t, claim=SECRETS, scope=Scope(namespace="other"))
    assert not in_scope(t, claim=SECRETS, scope=Scope(name="pw2"))


def test_event_line_and_object_meta() -> None:
    body = b'{"kind":"Secret","metadata":{"name":"pw","uid":"u"}}\n'
    assert json.loads(event_line("ADDED", body)) == {
        "type": "ADDED",
        "object": {"kind": "Secret", "metadata": {"name": "pw", "uid": "u"}},
    }
    meta = object_meta(body, table=False)
    assert meta is not None and meta.uid == "u"
    table = b'{"kind":"Table","metadata":{},"rows":[{"object":{"metadata":{"name":"pw"}}}]}'
    meta = object_meta(table, table=True)
    assert meta is not None and meta.name == "pw"
    # the representation decides: a Table's own metadata is no object's
    assert object_meta(table, table=False) is not None
    assert object_meta(b'{"rows":[]}', table=True) is None
    assert object_meta(b"garbage", table=False) is None


def _line(kind: str, name: str, labels: dict[str, str], columns: object) -> bytes:
    row = {
        "cells": [name],
        "object": {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {
                "name": name,
                "namespace": "ns",
                "uid": name,
                "resourceVersion": "5",
                "labels": labels,
                "annotations": {"kcp.io/cluster": "c1"},
            },
        },
    }
    obj = {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": "5"},
        "columnDefinitions": columns,
        "rows": [row],
    }
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


def test_a_table_watch_carries_the_columns_of_a_dropped_first_event() -> None:
    rules = parse_rules([{"resource": "secrets", "selector": {"matchLabels": {"a": "b"}}}])
    member = Member(selector=Selector(), claimed=ClaimedView(SECRETS, rules.for_claim(*SECRETS)))
    cols = [{"name": "Name", "type": "string"}]
    hidden = _line("ADDED", "hidden", {}, cols)
    shown = _line("ADDED", "shown", {"a": "b"}, None)
    later = _line("MODIFIED", "shown", {"a": "b"}, None)
    columns = Columns()
    framed = frame_events(
        bytearray(hidden + shown + later),
        selector=Selector(),
        table=True,
        member=member,
        columns=columns,
    )
    events = [json.loads(line) for line in framed.out.splitlines()]
    assert [e["object"]["rows"][0]["object"]["metadata"]["name"] for e in events] == [
        "shown",
        "shown",
    ]
    assert events[0]["object"]["columnDefinitions"] == cols
    assert events[1]["object"]["columnDefinitions"] is None
    assert b"hidden" not in framed.out
    # the first event sent with its own columns: nothing is carried
    columns = Columns()
    framed = frame_events(
        bytearray(_line("ADDED", "shown", {"a": "b"}, cols) + later),
        selector=Selector(),
        table=True,
        member=member,
        columns=columns,
    )
    assert framed.out == _line("ADDED", "shown", {"a": "b"}, cols) + later
