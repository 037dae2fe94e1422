"""Watches kcp answers for a slice that records holds (the deprecated ``/watch/`` paths, field
selector watches — the ones the shared cache does not serve), against real kcp: a slice's watch
never names an object the slice cannot see, and still tells its client when an object it could
see stops being visible (``vwserver.proxy.filtering``, the table of watch events).

* **Never seen.** An object moving from ``a`` to ``b`` is held by ``a`` until ``a`` releases it:
  ``b``'s watches get no event at all about it meanwhile (it used to be a synthetic DELETED
  with its name, uid and resourceVersion: an oracle for an object ``b`` may not see), and see
  it once ``a`` released it.
* **Stopped being visible.** An object ``b`` could see becomes invisible to ``b`` through the
  holds alone (its labels still match ``b``; another slice that holds it stopped matching):
  every watch of ``b`` whose client has it gets a DELETED naming it and nothing else — whether
  the watch delivered it itself, or the client had it from the LIST the watch started after.
  An object that stops matching ``b``'s labels gets kcp's own DELETED, the previous content.
"""

from __future__ import annotations

from typing import Any

from tests.e2e import test_handoff_kcp as handoff
from tests.e2e.test_handoff_kcp import FIN, WAIT, Bed, first_event, regions, serving
from tests.support.watches import recording
from tests.support.widgets import API
from vwserver.selector import Selector

bed = handoff.bed  # the handoff tests' fixture: a namespace of their own in the first consumer


def kcp_answered(bed: Bed, base: str, slice_name: str) -> dict[str, tuple[str, dict[str, str]]]:
    """The watches of ``slice_name`` that kcp answers: URL and query, by name."""
    root = bed.slice_url(base, slice_name).split(f"/{API}/")[0]
    return {
        "field-selector": (
            bed.slice_url(base, slice_name),
            {"fieldSelector": f"metadata.namespace={bed.namespace}"},
        ),
        "legacy-path": (f"{root}/{API}/watch/namespaces/{bed.namespace}/widgets", {}),
    }


def identity_only(event: dict[str, Any]) -> bool:
    obj = event["object"]
    return set(obj) <= {"apiVersion", "kind", "metadata"} and set(obj["metadata"]) <= {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "annotations",
    }


async def test_the_arriving_slice_hears_nothing_of_a_held_object(bed: Bed) -> None:
    name = "arriving"
    async with serving(bed, regions("a", "b")) as base:
        await bed.create(name, region="a")
        await bed.add_finalizer(base, "a", name)
        watches = kcp_answered(bed, base, "b")
        (fs_url, fs_query), (legacy_url, _) = watches["field-selector"], watches["legacy-path"]
        async with (
            # a cached watch of a: the cache (and with it the handoff loop) runs for widgets
            recording(bed.session, bed.slice_url(base, "a")),
            recording(bed.session, fs_url, **fs_query) as by_field,
            recording(bed.session, legacy_url, from_list=False) as by_path,
        ):
            recorders = (by_field, by_path)
            await bed.sentinel(recorders, "b")  # both established
            await bed.relabel(name, "b")
            await bed.leaving_since(name, "a")  # a MODIFIED in kcp: the move recorded
            await bed.patch_kcp(name, {"spec": {"size": 7}})  # and another one
            await bed.sentinel(recorders, "b")
            for recorder in recorders:
                assert not recorder.of(name), f"{recorder.url}: {recorder.of(name)}"
            await bed.release(base, "a", name)
            for recorder in recorders:
                event = await recorder.wait_for(
                    f"{name} in {recorder.url} after the release",
                    lambda r=recorder: first_event(r, name),
                    within=WAIT,
                )
                assert event["type"] in ("ADDED", "MODIFIED"), event
                assert not event["object"]["metadata"].get("finalizers"), event


async def test_an_object_that_stops_being_visible_is_shown_deleted(bed: Bed) -> None:
    held, relabelled = "overlapped", "relabelled"
    slices = {**regions("b"), "h": Selector.parse("tier=gold")}
    async with serving(bed, slices) as base:
        await bed.create(held, region="b", tier="gold")
        await bed.create(relabelled, region="b")
        FIN["h"] = "h.handoff.example.io/cleanup"
        try:
            await bed.add_finalizer(base, "h", held)  # h holds it, b sees it (both match)
        finally:
            del FIN["h"]
        watches = kcp_answered(bed, base, "b")
        (fs_url, fs_query), (legacy_url, _) = watches["field-selector"], watches["legacy-path"]
        async with (
            # the client has both objects from its LIST; this watch never delivered them
            recording(bed.session, fs_url, **fs_query) as by_field,
            # the initial state comes through the watch: it delivered them
            recording(bed.session, legacy_url, from_list=False) as by_path,
        ):
            assert {i["metadata"]["name"] for i in by_field.initial} >= {held, relabelled}
            await by_path.wait_for("initial ADDED", lambda: first_event(by_path, held), within=WAIT)
            # h stops matching: b's labels still match, but h's hold keeps it from b
            await bed.patch_kcp(held, {"metadata": {"labels": {"tier": "silver"}}})
            await bed.patch_kcp(relabelled, {"metadata": {"labels": {"region": "c"}}})
            await bed.sentinel((by_field, by_path), "b")
            for recorder in (by_field, by_path):
                gone = [e for e in recorder.of(held) if e["type"] == "DELETED"]
                assert len(gone) == 1, f"{recorder.url}: {recorder.of(held)}"
                assert identity_only(gone[0]), gone[0]
                left = [e for e in recorder.of(relabelled) if e["type"] == "DELETED"]
                assert len(left) == 1, f"{recorder.url}: {recorder.of(relabelled)}"
                # kcp's DELETED for an object that stopped matching: its previous content
                assert left[0]["object"]["metadata"]["labels"]["region"] == "b", left[0]
