"""The handoff's write rules against real kcp: how finalizers added through a slice are
recorded in the same write (merge patch, JSON patch, update, server-side apply with kcp's own
field ownership), what the proxy refuses, and the release of an object leaving a slice.
(The informer and syncer stories: test_handoff_kcp.py, test_syncer_kcp.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest_asyncio

from devenv.bootstrap import Bootstrap
from devenv.kcp import KcpInstance
from tests.support.slices import slice_url, slices_over_kcp
from vwserver.errors import ApiNotFound
from vwserver.holds import HOLDS_ANNOTATION, RELEASE_ANNOTATION
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import load_kubeconfig
from vwserver.selector import Selector

WAIT = 30.0
FIN_A = "a.example.io/cleanup"
FIN_AB = "ab.example.io/cleanup"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"
NS = "team-red"


@dataclass
class Bed:
    session: aiohttp.ClientSession
    base: str
    world: Bootstrap
    kcp: KubeClient
    """kcp's admin, for the consumer's own (direct) requests."""

    def via(self, slice_name: str, name: str = "") -> str:
        ws = self.world.consumers[0]
        url = f"{slice_url(self.base, self.world, slice_name, ws.cluster)}/apis/example.io/v1alpha1"
        url += f"/namespaces/{NS}/widgets"
        return f"{url}/{name}" if name else url

    def direct(self, name: str) -> str:
        ws = self.world.consumers[0]
        return f"{ws.url}/apis/example.io/v1alpha1/namespaces/{NS}/widgets/{name}"

    async def call(
        self, method: str, url: str, body: Any = None, *, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        headers = {"Content-Type": content_type} if body is not None else {}
        data = None if body is None else json.dumps(body)
        async with self.session.request(method, url, data=data, headers=headers) as r:
            return r.status, json.loads(await r.read())

    async def stored(self, name: str) -> dict[str, Any]:
        obj = await self.kcp.get(self.direct(name))
        assert obj is not None, name
        return obj

    async def direct_patch(self, name: str, patch: Any) -> None:
        await self.kcp.merge_patch(self.direct(name), patch)

    async def purge(self, name: str) -> None:
        obj = await self.kcp.get(self.direct(name))
        if obj is None:
            return
        if obj["metadata"].get("finalizers"):
            await self.direct_patch(name, {"metadata": {"finalizers": None}})
        with contextlib.suppress(ApiNotFound):  # gone with its last finalizer if deleting
            await self.kcp.delete(self.direct(name))


def holds_of(obj: dict[str, Any]) -> dict[str, Any]:
    raw = (obj["metadata"].get("annotations") or {}).get(HOLDS_ANNOTATION)
    return json.loads(raw) if raw else {}


def widget(name: str, region: str) -> dict[str, Any]:
    return {
        "apiVersion": "example.io/v1alpha1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": NS, "labels": {"region": region}},
        "spec": {"size": 1},
    }


@pytest_asyncio.fixture(loop_scope="session")
async def bed(kcp: KcpInstance, world: Bootstrap) -> AsyncIterator[Bed]:
    auth = await load_kubeconfig(kcp.kubeconfig, context=kcp.admin_context)
    async with (
        KubeClient(auth=auth) as direct,
        slices_over_kcp(
            kcp,
            world,
            slices={
                "hw-a": Selector.parse("region=ha"),
                "hw-b": Selector.parse("region=hb"),
                "hw-ab": Selector.parse("region in (ha,hb)"),
            },
            page_size=50,
            cache=True,
            handoff_interval=0.2,
        ) as base,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as session,
    ):
        bed = Bed(
            session=session,
            base=base,
            world=world,
            kcp=direct,
        )
        # The shared cache of widgets runs while someone reads them (as any informer does).
        code, _ = await bed.call("GET", bed.via("hw-a"))
        assert code == 200
        yield bed


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


SID_A = "{cluster}/hw-a"
SID_AB = "{cluster}/hw-ab"


async def test_apply_records_and_keeps_holds(bed: Bed) -> None:
    name = unique("apply")
    sid = SID_A.format(cluster=bed.world.provider.cluster)
    url = bed.via("hw-a", name) + "?fieldManager=ctl&force=true"
    config = widget(name, "ha")
    try:
        # kcp's APIExport virtual workspace (v0.32.3) records a server-side apply as an Update
        # of its manager, so a later apply of the same manager that changes a field conflicts
        # with itself and one that leaves a field out does not remove it — through kcp
        # directly as through a slice. So: applies with force, and the release by merge patch.
        code, body = await bed.call("POST", bed.via("hw-a"), config)
        assert code == 201, body
        config["metadata"]["finalizers"] = [FIN_A]
        code, body = await bed.call("PATCH", url, config, content_type=APPLY)
        assert code == 200, body
        assert holds_of(await bed.stored(name)) == {sid: {"finalizers": [FIN_A]}}
        # A later apply that does not state the annotation keeps it (the proxy states it).
        config["spec"] = {"size": 2}
        code, body = await bed.call("PATCH", url, config, content_type=APPLY)
        assert code == 200, json.dumps(body)
        stored = await bed.stored(name)
        assert stored["spec"]["size"] == 2
        assert holds_of(stored) == {sid: {"finalizers": [FIN_A]}}
        code, body = await bed.call(
            "PATCH", bed.via("hw-a", name), {"metadata": {"finalizers": None}}, content_type=MERGE
        )
        assert code == 200, body
        stored = await bed.stored(name)
        assert not stored["metadata"].get("finalizers")
        assert HOLDS_ANNOTATION not in (stored["metadata"].get("annotations") or {})
    finally:
        await bed.purge(name)


async def test_guards_and_the_release_of_a_leaving_object(bed: Bed) -> None:
    name = unique("leave")
    sid = SID_A.format(cluster=bed.world.provider.cluster)
    body = widget(name, "ha")
    try:
        code, created = await bed.call("POST", bed.via("hw-a"), body)
        assert code == 201, created
        # A JSON patch adds the finalizer: recorded in the same write.
        code, patched = await bed.call(
            "PATCH",
            bed.via("hw-a", name),
            [{"op": "add", "path": "/metadata/finalizers", "value": [FIN_A]}],
            content_type=JSON_PATCH,
        )
        assert code == 200, patched
        assert holds_of(await bed.stored(name)) == {sid: {"finalizers": [FIN_A]}}
        # No one can write the proxy's annotations through a slice.
        code, status = await bed.call(
            "PATCH",
            bed.via("hw-ab", name),
            {"metadata": {"annotations": {RELEASE_ANNOTATION: "*"}}},
            content_type=MERGE,
        )
        assert code == 422, status
        # The consumer moves it to hb: hw-a shows it being deleted, hw-b does not show it.
        await bed.direct_patch(name, {"metadata": {"labels": {"region": "hb"}}})

        async def leaving() -> dict[str, Any] | None:
            # shown being deleted at once; since the recorded time once the move is recorded
            code, obj = await bed.call("GET", bed.via("hw-a", name))
            since = holds_of(await bed.stored(name)).get(sid, {}).get("leavingSince")
            shown = code == 200 and obj["metadata"].get("deletionTimestamp")
            return (
                obj if shown and since and obj["metadata"]["deletionTimestamp"] == since else None
            )

        shown = await _eventually(leaving)
        assert shown["metadata"]["deletionGracePeriodSeconds"] == 0
        assert (
            shown["metadata"]["deletionTimestamp"]
            == holds_of(await bed.stored(name))[sid]["leavingSince"]
        )
        for slice_name in ("hw-b", "hw-ab"):
            code, _ = await bed.call("GET", bed.via(slice_name, name))
            assert code == 404, slice_name
        # Only the release is allowed through hw-a; the update kcp would refuse otherwise (a
        # changed deletionTimestamp) is the object as hw-a showed it.
        code, status = await bed.call("PUT", bed.via("hw-a", name), {**shown, "spec": {"size": 7}})
        assert code == 409, status
        release = json.loads(json.dumps(shown))
        release["metadata"]["finalizers"] = []
        code, released = await bed.call("PUT", bed.via("hw-a", name), release)
        assert code == 200, released
        stored = await bed.stored(name)
        assert not stored["metadata"].get("finalizers")
        assert HOLDS_ANNOTATION not in (stored["metadata"].get("annotations") or {})
        assert not stored["metadata"].get("deletionTimestamp")
        code, arrived = await bed.call("GET", bed.via("hw-b", name))
        assert code == 200 and not arrived["metadata"].get("deletionTimestamp")
    finally:
        await bed.purge(name)


async def _add_finalizer(bed: Bed, slice_name: str, name: str, finalizer: str) -> None:
    """A controller's (or a squatter's) merge patch adding ``finalizer`` through a slice."""
    code, obj = await bed.call("GET", bed.via(slice_name, name))
    assert code == 200, obj
    finalizers = [*obj["metadata"].get("finalizers", []), finalizer]
    code, body = await bed.call(
        "PATCH",
        bed.via(slice_name, name),
        {"metadata": {"finalizers": finalizers}},
        content_type=MERGE,
    )
    assert code == 200, body


async def _finish(bed: Bed, slice_name: str, name: str, finalizer: str) -> tuple[int, Any]:
    """A controller finishing ``finalizer`` the way client-go reconcilers do: GET, drop it
    from the list, PUT the object back."""
    code, obj = await bed.call("GET", bed.via(slice_name, name))
    assert code == 200, obj
    obj["metadata"]["finalizers"] = [f for f in obj["metadata"]["finalizers"] if f != finalizer]
    return await bed.call("PUT", bed.via(slice_name, name), obj)


async def test_a_squatted_finalizer_is_finished_by_its_controller(bed: Bed) -> None:
    """Issue 22, finding 5: a user of the overlapping slice hw-ab adds the finalizer name
    hw-a's controller uses — before hw-a's controller does (it then finds it present), and
    again after (removed and re-added through hw-ab, so hw-ab's record is the only one). The
    object is deleted; hw-a's controller finishes its finalizer through hw-a, and the object
    goes away."""
    cluster = bed.world.provider.cluster
    first, later = unique("squat-first"), unique("squat-later")
    try:
        for name in (first, later):
            code, created = await bed.call("POST", bed.via("hw-a"), widget(name, "ha"))
            assert code == 201, created
            if name == first:
                await _add_finalizer(bed, "hw-ab", name, FIN_A)  # before hw-a's controller
            else:
                await _add_finalizer(bed, "hw-a", name, FIN_A)  # hw-a's controller first ...
                code, status = await _finish(bed, "hw-ab", name, FIN_A)  # ... hw-ab takes over
                assert code == 200, status
                await _add_finalizer(bed, "hw-ab", name, FIN_A)
            assert holds_of(await bed.stored(name)) == {
                SID_AB.format(cluster=cluster): {"finalizers": [FIN_A]}
            }
            # hw-a's controller "adds" its finalizer again: already there, nothing recorded.
            code, obj = await bed.call("GET", bed.via("hw-a", name))
            assert code == 200 and obj["metadata"]["finalizers"] == [FIN_A], obj
            code, obj = await bed.call("PUT", bed.via("hw-a", name), obj)
            assert code == 200, obj
            assert holds_of(await bed.stored(name)) == {
                SID_AB.format(cluster=cluster): {"finalizers": [FIN_A]}
            }
            code, deleting = await bed.call("DELETE", bed.via("hw-a", name))
            assert code in (200, 202), deleting
            assert deleting["metadata"].get("deletionTimestamp"), deleting
            # kcp's own deletion: hw-a's controller finishes its finalizer.
            code, finished = await _finish(bed, "hw-a", name, FIN_A)
            assert code == 200, finished

            async def gone(name: str = name) -> bool:
                return await bed.kcp.get(bed.direct(name)) is None

            await _eventually(gone)
    finally:
        for name in (first, later):
            await bed.purge(name)


async def test_a_leaving_slices_finalizer_is_kept_from_the_others(bed: Bed) -> None:
    """The rule in reverse: while the object is leaving hw-a, hw-ab (which holds a finalizer
    of its own, so it still sees the object) cannot take hw-a's finalizer — 422 naming hw-a —
    but finishes its own; hw-a's release still works."""
    name = unique("guard")
    sid_a = SID_A.format(cluster=bed.world.provider.cluster)
    try:
        code, created = await bed.call("POST", bed.via("hw-a"), widget(name, "ha"))
        assert code == 201, created
        await _add_finalizer(bed, "hw-a", name, FIN_A)
        await _add_finalizer(bed, "hw-ab", name, FIN_AB)
        await bed.direct_patch(name, {"metadata": {"labels": {"region": "hb"}}})

        async def recorded() -> bool:
            return bool(holds_of(await bed.stored(name)).get(sid_a, {}).get("leavingSince"))

        await _eventually(recorded)
        code, status = await _finish(bed, "hw-ab", name, FIN_A)
        assert code == 422 and status["reason"] == "Invalid", status
        assert "hw-a" in status["message"] and "leaving" in status["message"], status
        code, status = await bed.call(
            "PATCH",
            bed.via("hw-ab", name),
            {"metadata": {"finalizers": None}},
            content_type=MERGE,
        )
        assert code == 422, status
        code, finished = await _finish(bed, "hw-ab", name, FIN_AB)
        assert code == 200, finished
        assert (await bed.stored(name))["metadata"]["finalizers"] == [FIN_A]
        code, released = await _finish(bed, "hw-a", name, FIN_A)
        assert code == 200, released
        stored = await bed.stored(name)
        assert not stored["metadata"].get("finalizers")
        assert HOLDS_ANNOTATION not in (stored["metadata"].get("annotations") or {})
    finally:
        await bed.purge(name)


async def _eventually(check: Any) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while loop.time() < deadline:
        result = await check()
        if result:
            return result
        await asyncio.sleep(0.2)
    raise AssertionError(f"not within {WAIT}s: {check.__name__}")


def holder_of(sid: str) -> str:
    """The holder label of slice ``sid``, spelled out: kcp is asked for it by LISTs."""
    return "holder.sync.edge-connect.eu/" + hashlib.sha256(sid.encode()).hexdigest()[:40]


async def test_the_holder_label_follows_the_hold_and_no_client_writes_it(bed: Bed) -> None:
    """Every write that records or ends a hold sets or removes the slice's holder label in the
    same write (merge patch, JSON patch, update, apply); a client sets, changes or removes none
    through a slice (422), and an update that leaves it out keeps it."""
    name = unique("label")
    sid = SID_A.format(cluster=bed.world.provider.cluster)
    key = holder_of(sid)
    try:
        forged = widget(name, "ha")
        forged["metadata"]["labels"][key] = "true"
        code, status = await bed.call("POST", bed.via("hw-a"), forged)
        assert code == 422 and key in json.dumps(status), status
        code, created = await bed.call("POST", bed.via("hw-a"), widget(name, "ha"))
        assert code == 201, created
        patch = {"metadata": {"finalizers": [FIN_A]}}
        code, body = await bed.call("PATCH", bed.via("hw-a", name), patch, content_type=MERGE)
        assert code == 200, body
        stored = await bed.stored(name)
        assert stored["metadata"]["labels"] == {"region": "ha", key: "true"}
        assert holds_of(stored) == {sid: {"finalizers": [FIN_A]}}
        for attempt, content_type in (
            ({"metadata": {"labels": {key: None}}}, MERGE),
            ({"metadata": {"labels": {key: "false"}}}, MERGE),
            (
                [{"op": "replace", "path": "/metadata/labels", "value": {"region": "ha"}}],
                JSON_PATCH,
            ),
        ):
            code, status = await bed.call(
                "PATCH", bed.via("hw-ab", name), attempt, content_type=content_type
            )
            assert code == 422 and status["reason"] == "Invalid", (attempt, status)
        # an update without the label (a client that never saw it): put back
        shown = dict(stored)
        shown["metadata"] = {**stored["metadata"], "labels": {"region": "ha", "tier": "x"}}
        code, body = await bed.call("PUT", bed.via("hw-a", name), shown)
        assert code == 200, body
        assert (await bed.stored(name))["metadata"]["labels"] == {
            "region": "ha",
            "tier": "x",
            key: "true",
        }
        # the release (a JSON patch removing the finalizer) ends the hold and its label
        code, body = await bed.call(
            "PATCH",
            bed.via("hw-a", name),
            [{"op": "remove", "path": "/metadata/finalizers/0"}],
            content_type=JSON_PATCH,
        )
        assert code == 200, body
        stored = await bed.stored(name)
        assert stored["metadata"]["labels"] == {"region": "ha", "tier": "x"}
        assert not holds_of(stored)
        # a server-side apply that adds the finalizer sets it too; a later apply keeps it
        url = bed.via("hw-a", name) + "?fieldManager=ctl&force=true"
        config = widget(name, "ha")
        config["metadata"]["finalizers"] = [FIN_A]
        code, body = await bed.call("PATCH", url, config, content_type=APPLY)
        assert code == 200, body
        assert (await bed.stored(name))["metadata"]["labels"].get(key) == "true"
        config["spec"] = {"size": 3}
        code, body = await bed.call("PATCH", url, config, content_type=APPLY)
        assert code == 200, body
        assert (await bed.stored(name))["metadata"]["labels"].get(key) == "true"
    finally:
        await bed.purge(name)


async def test_a_missing_holder_label_is_repaired_by_the_handoff_loop(bed: Bed) -> None:
    """A recorded hold whose label is gone (removed directly in kcp, or written before the
    labels existed) gets it back from the handoff loop — until then the annotation alone
    decides what the slice sees (its cached reads show the object all along)."""
    name = unique("repair")
    key = holder_of(SID_A.format(cluster=bed.world.provider.cluster))
    try:
        code, created = await bed.call("POST", bed.via("hw-a"), widget(name, "ha"))
        assert code == 201, created
        patch = {"metadata": {"finalizers": [FIN_A]}}
        code, body = await bed.call("PATCH", bed.via("hw-a", name), patch, content_type=MERGE)
        assert code == 200, body
        await bed.direct_patch(name, {"metadata": {"labels": {key: None}}})

        async def repaired() -> bool:
            return (await bed.stored(name))["metadata"]["labels"].get(key) == "true"

        deadline = asyncio.get_running_loop().time() + WAIT
        while not await repaired():
            assert asyncio.get_running_loop().time() < deadline, "the label was not repaired"
            await asyncio.sleep(0.1)
    finally:
        await bed.purge(name)
