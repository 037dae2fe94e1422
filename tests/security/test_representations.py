"""Property-based: every decoder judges an object by its own metadata, in the shape the request
negotiated, whatever members the object has (``vwserver.proxy.filtering``).

Random custom-resource objects — any kind (``Table`` and ``PartialObjectMetadata`` included),
random top-level members named ``object``, ``rows``, ``items``, ``metadata``-like nested
documents, ``type``, ``columnDefinitions``, holding labels that match or do not and the holds
annotation's name — are put in every shape the proxy reads: a plain list page, a Table page
(rows embedding the object), a plain watch event, a Table watch event, and checked against the
same decision made on the object's own metadata only (its labels, holds, and the request's
scope). Their planted members must change nothing.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vwserver.holds import HOLDS_ANNOTATION, Hold, Member, render_holds, sees
from vwserver.k8s.types import ObjectMeta
from vwserver.proxy.filtering import Delivered, Scope, decode_page, filter_event
from vwserver.selector import Selector

PROD = Selector.parse("env=prod")
MEMBER = Member(selector=PROD, id="ws/prod", peers=lambda sid: Selector.parse("env=dev"))
SCOPE = Scope(cluster="c1", namespace="ns1")

labels = st.dictionaries(
    st.sampled_from(["env", "region", "tier"]), st.sampled_from(["prod", "dev", "eu"]), max_size=2
)
clusters = st.sampled_from(["c1", "c2"])
namespaces = st.sampled_from(["ns1", "ns2"])


@st.composite
def metadata(draw: st.DrawFn, *, name: str) -> dict[str, Any]:
    annotations = {"kcp.io/cluster": draw(clusters)}
    if draw(st.booleans()):
        # held by another slice (ws/dev), with its finalizer on the object or not
        annotations[HOLDS_ANNOTATION] = render_holds({"ws/dev": Hold(finalizers=("f",))}) or ""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": draw(namespaces),
        "uid": f"uid-{name}",
        "resourceVersion": "7",
        "labels": draw(labels),
        "annotations": annotations,
    }
    if draw(st.booleans()):
        meta["finalizers"] = ["f"]
    return meta


@st.composite
def objects(draw: st.DrawFn, name: str = "x") -> dict[str, Any]:
    own = draw(metadata(name=name))
    planted = draw(metadata(name=name)) | {"labels": {"env": "prod"}}
    planted["annotations"][HOLDS_ANNOTATION] = "{}"
    obj: dict[str, Any] = {
        "apiVersion": "shapes.example.io/v1",
        "kind": draw(st.sampled_from(["Parcel", "Table", "PartialObjectMetadata", "List"])),
        "metadata": own,
    }
    members = {
        "object": {"kind": "PartialObjectMetadata", "metadata": planted},
        "rows": [{"cells": [name], "object": {"metadata": planted}}],
        "items": [{"metadata": planted}],
        "type": "ADDED",
        "columnDefinitions": [],
        "spec": {"metadata": planted, "object": {"metadata": planted}},
    }
    for key in draw(st.lists(st.sampled_from(sorted(members)), unique=True)):
        obj[key] = members[key]
    return obj


def own_decision(obj: dict[str, Any], *, scope: Scope = SCOPE) -> bool:
    """Shown, judged by the object's own metadata alone."""
    meta = obj["metadata"]
    decoded = ObjectMeta(
        name=meta["name"],
        namespace=meta["namespace"],
        labels=meta["labels"],
        annotations=meta["annotations"],
        finalizers=meta.get("finalizers"),
    )
    return (
        scope.admits(decoded)
        and PROD.matches(meta["labels"])
        and sees(
            MEMBER,
            labels=meta["labels"],
            annotations=meta["annotations"],
            finalizers=meta.get("finalizers"),
        )
    )


FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(st.lists(objects(), min_size=1, max_size=4))
def test_list_and_table_pages_judge_each_object_by_its_own_metadata(
    items: list[dict[str, Any]],
) -> None:
    for i, obj in enumerate(items):
        obj["metadata"]["name"] = obj["metadata"]["uid"] = f"o{i}"
    expected = [own_decision(o) for o in items]
    plain = {"kind": "ParcelList", "apiVersion": "v1", "metadata": {}, "items": items}
    page = decode_page(json.dumps(plain).encode(), scope=SCOPE)
    shown = {json.loads(bytes(e))["metadata"]["name"] for e in page.visible(PROD, MEMBER)}
    assert shown == {o["metadata"]["name"] for o, e in zip(items, expected, strict=True) if e}
    members = {json.loads(bytes(e))["metadata"]["name"] for e in page.members(MEMBER, Selector())}
    assert members == shown
    table = {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {},
        "columnDefinitions": [],
        "rows": [{"cells": [o["metadata"]["name"]], "object": o} for o in items],
    }
    page = decode_page(json.dumps(table).encode(), table=True, scope=SCOPE)
    rows = {json.loads(bytes(e))["cells"][0] for e in page.visible(PROD, MEMBER)}
    assert rows == shown


@FAST
@given(objects(), st.sampled_from(["ADDED", "MODIFIED", "DELETED"]), st.booleans())
def test_watch_events_judge_the_object_by_its_own_metadata(
    obj: dict[str, Any], kind: str, delivered_before: bool
) -> None:
    expected = own_decision(obj)
    plain = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
    row = {"cells": [obj["metadata"]["name"]], "object": obj}
    table = {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {}, "rows": [row]}
    tabled = json.dumps({"type": kind, "object": table}).encode() + b"\n"
    for line, is_table in ((plain, False), (tabled, True)):
        delivered = Delivered(keys={"uid-x"} if delivered_before else set())
        verdict = filter_event(
            line, PROD, table=is_table, member=MEMBER, scope=SCOPE, delivered=delivered
        )
        assert verdict.forward == expected
        if expected:
            continue
        meta = obj["metadata"]
        identity = ObjectMeta(
            name=meta["name"], namespace=meta["namespace"], annotations=meta["annotations"]
        )
        # nothing about an object the watch never showed; a bare DELETED for one it did
        assert (verdict.replacement is not None) == (delivered_before and SCOPE.admits(identity))
        if verdict.replacement is not None:
            out = json.loads(verdict.replacement)
            assert out["type"] == "DELETED"
            assert b"prod" not in verdict.replacement  # no labels, no planted member
