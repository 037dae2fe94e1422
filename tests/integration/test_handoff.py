"""The handoff between slices over the fake upstream (vwserver.holds, proxy/holding.py,
controller/handoff.py): every read and write path of a slice that lets go of an object, and of
the slice that waits for it. The same story against real kcp: tests/e2e/test_handoff_kcp.py and
the syncer's acceptance test."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import pytest

from fakekcp.upstream import FakeUpstream
from tests.integration.conftest import PROXY_TOKEN, SLICE_CLUSTER, widget
from tests.support.cache import CachedProxy, cached_proxy
from vwserver.cache.registry import CacheRegistry
from vwserver.controller.handoff import Handoff
from vwserver.holds import (
    DEFAULT_HOLD_TIMEOUT_SECONDS,
    HOLDS_ANNOTATION,
    RELEASE_ANNOTATION,
    effective_holds,
)
from vwserver.metrics import ServerMetrics
from vwserver.routes import Route, Routes, RouteTable
from vwserver.selector import Selector

WAIT = 10.0
FIN_A = "a.example.io/cleanup"
FIN_B = "b.example.io/cleanup"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
T = TypeVar("T")


@dataclass
class World(CachedProxy):
    handoff: Handoff
    """The handoff loop the app runs (the fixture makes it: its scan interval is the parameter)."""

    def url(self, slice_name: str, name: str | None = None, *, cluster: str = "c1") -> str:
        prefix = f"{self.base}/services/filtered-apiexport/{SLICE_CLUSTER}/{slice_name}"
        coll = f"{prefix}/clusters/{cluster}/apis/example.io/v1alpha1/namespaces/ns1/widgets"
        return f"{coll}/{name}" if name else coll

    def everywhere(self, slice_name: str) -> str:
        """The slice's widgets across every logical cluster and namespace."""
        prefix = f"{self.base}/services/filtered-apiexport/{SLICE_CLUSTER}/{slice_name}"
        return f"{prefix}/clusters/*/apis/example.io/v1alpha1/widgets"

    async def call(
        self, method: str, url: str, body: Any = None, *, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self.session.request(method, url, data=data, headers=headers) as r:
            return r.status, json.loads(await r.read())

    async def call_with(self, method: str, url: str, params: dict[str, str]) -> tuple[int, Any]:
        async with self.session.request(method, url, params=params) as r:
            return r.status, json.loads(await r.read())

    def stored(self, name: str) -> dict[str, Any]:
        obj = self.fake.get(cluster="c1", namespace="ns1", name=name)
        assert obj is not None
        return obj

    def relabel(self, name: str, **labels: str) -> None:
        """A consumer's direct write in kcp (not through a slice)."""
        obj = self.stored(name)
        obj["metadata"]["labels"] = {**obj["metadata"].get("labels", {}), **labels}
        self.fake.update(cluster="c1", obj=obj)

    def annotate(self, name: str, key: str, value: str) -> None:
        obj = self.stored(name)
        obj["metadata"].setdefault("annotations", {})[key] = value
        self.fake.update(cluster="c1", obj=obj)


def holds_of(obj: dict[str, Any]) -> dict[str, Any]:
    raw = (obj["metadata"].get("annotations") or {}).get(HOLDS_ANNOTATION)
    return json.loads(raw) if raw else {}


async def eventually(what: str, check: Callable[[], Awaitable[T | None]]) -> T:
    deadline = asyncio.get_running_loop().time() + WAIT
    while True:
        result = await check()
        if result:
            return result
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {WAIT}s: {what}")
        await asyncio.sleep(0.05)


def routes(vw_url: str, *, timeout: float | None = None) -> RouteTable:
    def route(name: str, selector: str, **kw: Any) -> Route:
        return Route(
            cluster=SLICE_CLUSTER,
            name=name,
            selector=Selector.parse(selector),
            upstream_url=vw_url,
            **kw,
        )

    return RouteTable(
        [
            route("a", "region=a", hold_timeout=timeout or DEFAULT_HOLD_TIMEOUT_SECONDS),
            route("b", "region=b"),
            route("ab", "region in (a,b)"),
            route("a-direct", "region=a", cache=False),
            route("b-direct", "region=b", cache=False),
        ]
    )


@pytest.fixture(params=[(None, 0.05)], ids=["no-timeout"])
async def world(request: pytest.FixtureRequest) -> AsyncIterator[World]:
    """(hold timeout of slice a, handoff scan interval) as the parameter."""
    timeout, interval = request.param

    def handoff(registry: CacheRegistry, table: Routes, metrics: ServerMetrics) -> Handoff:
        return Handoff(
            registry=registry,
            routes=table,
            clock=registry.clock,
            interval=interval,
            stuck_after=1.0,
            metrics=metrics,
        )

    async with cached_proxy(
        FakeUpstream(bookmark_interval=0.2),
        routes=lambda vw_url: routes(vw_url, timeout=timeout),
        token=PROXY_TOKEN,
        within=WAIT,
        seed=lambda fake: fake.bind(cluster="c1"),
        handoff=handoff,
        world=World,
    ) as world:
        yield world


async def held_by_a(world: World, name: str) -> dict[str, Any]:
    """An object in slice ``a`` with a finalizer added through ``a`` (and the shared cache of
    widgets running, as it is while any informer reads them)."""
    code, _ = await world.call("GET", world.url("a"))
    assert code == 200
    body = widget(name, region="a")
    body["metadata"]["finalizers"] = [FIN_A]
    code, created = await world.call("POST", world.url("a"), body)
    assert code == 201, created
    assert holds_of(world.stored(name)) == {f"{SLICE_CLUSTER}/a": {"finalizers": [FIN_A]}}
    return created


async def leaving_a(world: World, name: str) -> dict[str, Any]:
    """``held_by_a`` relabelled to ``b`` in kcp, once the move is recorded and ``a`` shows it
    being deleted since then."""
    await held_by_a(world, name)
    world.relabel(name, region="b")
    return await recorded_leaving(world, name)


async def recorded_leaving(world: World, name: str, slice_name: str = "a") -> dict[str, Any]:
    """The object as ``slice_name`` shows it once its leave is recorded (a GET before that
    shows it being deleted too, since a provisional time)."""

    async def shown_deleted() -> dict[str, Any] | None:
        code, obj = await world.call("GET", world.url(slice_name, name))
        assert code == 200 and obj["metadata"].get("deletionTimestamp"), obj
        hold = holds_of(world.stored(name)).get(f"{SLICE_CLUSTER}/{slice_name}", {})
        since = hold.get("leavingSince")
        return obj if since and obj["metadata"]["deletionTimestamp"] == since else None

    return await eventually(f"{slice_name} shows the object being deleted", shown_deleted)


# --- recording ----------------------------------------------------------------------------------


async def test_finalizers_added_through_a_slice_are_recorded_in_the_same_write(
    world: World,
) -> None:
    await held_by_a(world, "w1")
    # A merge patch adding a second finalizer, then a JSON patch, then an update: each records.
    code, _ = await world.call(
        "PATCH",
        world.url("a", "w1"),
        {"metadata": {"finalizers": [FIN_A, "a.example.io/second"]}},
        content_type=MERGE,
    )
    assert code == 200
    assert holds_of(world.stored("w1"))[f"{SLICE_CLUSTER}/a"]["finalizers"] == [
        FIN_A,
        "a.example.io/second",
    ]
    code, _ = await world.call(
        "PATCH",
        world.url("a", "w1"),
        [{"op": "add", "path": "/metadata/finalizers/-", "value": "a.example.io/third"}],
        content_type=JSON_PATCH,
    )
    assert code == 200
    assert "a.example.io/third" in holds_of(world.stored("w1"))[f"{SLICE_CLUSTER}/a"]["finalizers"]
    # Removing its own finalizers through the slice shrinks the entry, and the last removes it.
    current = world.stored("w1")
    current["metadata"]["finalizers"] = []
    code, body = await world.call("PUT", world.url("a", "w1"), current)
    assert code == 200, body
    assert HOLDS_ANNOTATION not in (world.stored("w1")["metadata"].get("annotations") or {})


async def test_a_slice_served_without_the_cache_records_no_holds(world: World) -> None:
    body = widget("plain", region="a")
    body["metadata"]["finalizers"] = [FIN_A]
    code, _ = await world.call("POST", world.url("a-direct"), body)
    assert code == 201
    assert holds_of(world.stored("plain")) == {}


async def test_another_slices_finalizer_can_be_finished_while_that_slice_sees_the_object(
    world: World,
) -> None:
    """While a still sees the object as a member, any slice that sees it may remove a's
    finalizer (as in Kubernetes), and a's entry goes in the same write: a name recorded by
    squatting never keeps a controller from finishing its own finalizer."""
    await held_by_a(world, "w1")
    stored = world.stored("w1")
    code, status = await world.call(
        "PATCH",
        world.url("ab", "w1"),
        {"metadata": {"finalizers": [], "resourceVersion": stored["metadata"]["resourceVersion"]}},
        content_type=MERGE,
    )
    assert code == 200, status
    assert not world.stored("w1")["metadata"].get("finalizers")
    assert holds_of(world.stored("w1")) == {}


async def test_a_leaving_slices_finalizer_cannot_be_removed_through_another(world: World) -> None:
    await held_by_a(world, "w1")
    # ab holds a finalizer too, so it still sees the object once it leaves a.
    code, _ = await world.call(
        "PATCH",
        world.url("ab", "w1"),
        {"metadata": {"finalizers": [FIN_A, "ab.example.io/cleanup"]}},
        content_type=MERGE,
    )
    assert code == 200
    world.relabel("w1", region="b")

    async def recorded() -> bool:
        return bool(holds_of(world.stored("w1"))[f"{SLICE_CLUSTER}/a"].get("leavingSince"))

    await eventually("the move is recorded", recorded)
    stored = world.stored("w1")
    code, status = await world.call(
        "PATCH",
        world.url("ab", "w1"),
        {
            "metadata": {
                "finalizers": ["ab.example.io/cleanup"],
                "resourceVersion": stored["metadata"]["resourceVersion"],
            }
        },
        content_type=MERGE,
    )
    assert code == 422, status
    assert status["reason"] == "Invalid" and FIN_A in status["message"]
    assert world.stored("w1")["metadata"]["finalizers"] == [FIN_A, "ab.example.io/cleanup"]
    stored["metadata"]["finalizers"] = ["ab.example.io/cleanup"]
    code, status = await world.call("PUT", world.url("ab", "w1"), stored)
    assert code == 422, status
    # ab lets go of its own (its last) finalizer; a's is still there.
    stored = world.stored("w1")
    stored["metadata"]["finalizers"] = [FIN_A]
    code, status = await world.call("PUT", world.url("ab", "w1"), stored)
    assert code == 200, status
    assert world.stored("w1")["metadata"]["finalizers"] == [FIN_A]


async def test_clients_cannot_write_the_proxys_annotations(world: World) -> None:
    await held_by_a(world, "w1")
    before = world.stored("w1")["metadata"]["annotations"][HOLDS_ANNOTATION]
    for key in (HOLDS_ANNOTATION, RELEASE_ANNOTATION):
        code, status = await world.call(
            "PATCH",
            world.url("ab", "w1"),
            {"metadata": {"annotations": {key: "*"}}},
            content_type=MERGE,
        )
        assert code == 422, status
        code, status = await world.call(
            "PATCH",
            world.url("ab", "w1"),
            [{"op": "remove", "path": "/metadata/annotations"}],
            content_type=JSON_PATCH,
        )
        assert code == 422, status
    body = widget("w2", region="a")
    body["metadata"]["annotations"] = {RELEASE_ANNOTATION: "*"}
    code, status = await world.call("POST", world.url("a"), body)
    assert code == 422, status
    # An update carrying a tampered value gets the proxy's value back.
    stored = world.stored("w1")
    stored["metadata"]["annotations"][HOLDS_ANNOTATION] = "{}"
    stored["metadata"]["annotations"][RELEASE_ANNOTATION] = "*"
    code, _ = await world.call("PUT", world.url("ab", "w1"), stored)
    assert code == 200
    annotations = world.stored("w1")["metadata"]["annotations"]
    assert annotations[HOLDS_ANNOTATION] == before
    assert RELEASE_ANNOTATION not in annotations


# --- leaving and arriving -------------------------------------------------------------------------


async def test_a_moved_object_is_deleted_gracefully_in_the_source_and_held_from_the_target(
    world: World,
) -> None:
    async with (
        world.session.get(world.url("a"), params={"watch": "1"}) as watch_a,
        world.session.get(world.url("b"), params={"watch": "1"}) as watch_b,
    ):
        shown = await leaving_a(world, "mover")
        since = holds_of(world.stored("mover"))[f"{SLICE_CLUSTER}/a"]["leavingSince"]
        assert shown["metadata"]["deletionTimestamp"] == since
        assert shown["metadata"]["deletionGracePeriodSeconds"] == 0
        assert shown["metadata"]["labels"]["region"] == "b"
        assert not world.stored("mover")["metadata"].get("deletionTimestamp")
        # LIST: a shows it being deleted; b does not show it, nor does a GET there.
        code, listed = await world.call("GET", world.url("a"))
        assert [i["metadata"].get("deletionTimestamp") for i in listed["items"]] == [since]
        for url in (world.url("b"), world.everywhere("b")):
            code, listed = await world.call("GET", url)
            assert code == 200 and listed["items"] == []
        missing_code, missing = await world.call("GET", world.url("b", "nothing"))
        code, hidden = await world.call("GET", world.url("b", "mover"))
        assert (code, hidden["reason"]) == (missing_code, missing["reason"]) == (404, "NotFound")
        # Through a, anything but releasing a's finalizer is refused: the object is leaving.
        update = dict(shown, spec={"size": 9})
        code, status = await world.call("PUT", world.url("a", "mover"), update)
        assert (code, status["reason"]) == (409, "Conflict"), status
        assert "leaving the slice" in status["message"]
        code, status = await world.call("DELETE", world.url("a", "mover"))
        assert code == 409, status
        # The release: a's controller removes its finalizer (an update of what it read).
        release = json.loads(json.dumps(shown))
        release["metadata"]["finalizers"] = []
        code, released = await world.call("PUT", world.url("a", "mover"), release)
        assert code == 200, released
        assert released["metadata"]["deletionTimestamp"] == since
        stored = world.stored("mover")
        assert stored["metadata"].get("finalizers", []) == []
        assert HOLDS_ANNOTATION not in (stored["metadata"].get("annotations") or {})
        # Now a sees DELETED, b sees ADDED; a's events never showed the object without
        # the deletion once it was leaving.
        events_a = await _events(watch_a, until=lambda e: e["type"] == "DELETED")
        events_b = await _events(watch_b, until=lambda e: e["type"] == "ADDED")
    assert [e["type"] for e in events_a][:1] == ["ADDED"]
    assert events_a[-1]["type"] == "DELETED"
    assert [e["type"] for e in events_b] == ["ADDED"]
    assert (
        events_b[0]["object"]["metadata"]["resourceVersion"]
        == stored["metadata"]["resourceVersion"]
    )
    assert not events_b[0]["object"]["metadata"].get("deletionTimestamp")


async def test_a_slice_served_by_kcp_also_waits_for_the_release(world: World) -> None:
    """Without the cache (kcp answers the label-selected reads) the arriving object is still
    hidden: in the LIST, the GET and the watch (where its release arrives as a MODIFIED: kcp's
    label-selected watch saw it arrive earlier, so the stateless filter cannot know the client
    never saw it — client-go's informers take it as an add)."""
    async with world.session.get(world.url("b-direct"), params={"watch": "1"}) as watch:
        shown = await leaving_a(world, "direct")
        code, listed = await world.call("GET", world.url("b-direct"))
        assert code == 200 and listed["items"] == []
        code, _ = await world.call("GET", world.url("b-direct", "direct"))
        assert code == 404
        release = json.loads(json.dumps(shown))
        release["metadata"]["finalizers"] = []
        code, _ = await world.call("PUT", world.url("a", "direct"), release)
        assert code == 200
        events = await _events(watch, until=lambda e: e["type"] != "DELETED")
    # While hidden, a change of the object is a synthetic DELETED carrying only its identity
    # (the stateless filter's answer to a MODIFIED it may not show), never its content.
    assert events[-1]["type"] == "MODIFIED"
    assert not events[-1]["object"]["metadata"].get("finalizers")
    for event in events[:-1]:
        assert event["type"] == "DELETED" and "spec" not in event["object"]
        assert "labels" not in event["object"]["metadata"]
    code, listed = await world.call("GET", world.url("b-direct"))
    assert [i["metadata"]["name"] for i in listed["items"]] == ["direct"]


async def test_release_by_merge_patch_and_by_json_patch(world: World) -> None:
    shown = await leaving_a(world, "m1")
    code, body = await world.call(
        "PATCH",
        world.url("a", "m1"),
        {"metadata": {"finalizers": None, "resourceVersion": shown["metadata"]["resourceVersion"]}},
        content_type=MERGE,
    )
    assert code == 200, body
    assert body["metadata"]["deletionTimestamp"]
    assert world.stored("m1")["metadata"].get("finalizers", []) == []

    shown = await leaving_a(world, "m2")
    code, body = await world.call(
        "PATCH",
        world.url("a", "m2"),
        [{"op": "remove", "path": "/metadata/finalizers/0"}],
        content_type=JSON_PATCH,
    )
    assert code == 200, body
    assert world.stored("m2")["metadata"].get("finalizers", []) == []
    # A patch that changes anything else is refused.
    shown = await leaving_a(world, "m3")
    code, status = await world.call(
        "PATCH",
        world.url("a", "m3"),
        {"metadata": {"finalizers": None}, "spec": {"size": 5}},
        content_type=MERGE,
    )
    assert code == 409, status
    assert world.stored("m3")["metadata"]["finalizers"] == [FIN_A]


async def test_a_move_back_before_the_release_is_still_a_deletion(world: World) -> None:
    """A → B → A before A released: Kubernetes never takes a deletionTimestamp back, so A
    keeps seeing the object being deleted (LIST, GET, WATCH) until it releases its finalizer;
    then A's watch gets DELETED, and ADDED for the object that is A's again. B never sees it,
    and neither does the overlapping slice ab (which matches it, but its holder is letting go)
    until the release."""
    code, _ = await world.call("GET", world.url("a"))
    assert code == 200
    async with (
        world.session.get(world.url("a"), params={"watch": "1"}) as watch_a,
        world.session.get(world.url("b"), params={"watch": "1", "timeoutSeconds": "4"}) as watch_b,
        world.session.get(world.url("ab"), params={"watch": "1"}) as watch_ab,
    ):
        shown = await leaving_a(world, "back")
        since = shown["metadata"]["deletionTimestamp"]
        world.relabel("back", region="a")
        await asyncio.sleep(0.3)  # several of the loop's scans (every 0.05 s) of the move back
        assert holds_of(world.stored("back"))[f"{SLICE_CLUSTER}/a"]["leavingSince"] == since
        code, obj = await world.call("GET", world.url("a", "back"))
        assert code == 200 and obj["metadata"]["deletionTimestamp"] == since
        assert obj["metadata"]["labels"]["region"] == "a"
        code, listed = await world.call("GET", world.url("a"))
        assert [i["metadata"].get("deletionTimestamp") for i in listed["items"]] == [since]
        for other in ("b", "ab"):
            code, _ = await world.call("GET", world.url(other, "back"))
            assert code == 404, other
            code, listed = await world.call("GET", world.url(other))
            assert listed["items"] == [], other
        # Through a, only the release is allowed (the object is being deleted there).
        update = dict(obj, spec={"size": 9})
        code, status = await world.call("PUT", world.url("a", "back"), update)
        assert code == 409, status
        release = json.loads(json.dumps(obj))
        release["metadata"]["finalizers"] = []
        code, released = await world.call("PUT", world.url("a", "back"), release)
        assert code == 200, released
        seen: list[str] = []

        def readded(event: dict[str, Any]) -> bool:
            seen.append(event["type"])
            return seen[-2:] == ["DELETED", "ADDED"]

        events_a = await _events(watch_a, until=readded)
        events_ab = await _events(watch_ab, until=lambda e: e["type"] == "ADDED")
        # b: nothing at all until its watch times out (the object is a's again)
        async with asyncio.timeout(WAIT):
            assert await watch_b.content.read() == b""
    # a: created, shown being deleted, ... , DELETED, ADDED — never a deletion taken back
    kinds = [e["type"] for e in events_a]
    assert kinds[0] == "ADDED" and kinds[-2:] == ["DELETED", "ADDED"], kinds
    deleting = False
    for event in events_a[:-1]:
        has = bool(event["object"]["metadata"].get("deletionTimestamp"))
        assert not (deleting and not has), f"the deletionTimestamp went away: {events_a}"
        deleting = deleting or has
    assert deleting
    back = events_a[-1]["object"]
    assert back["metadata"]["labels"]["region"] == "a" and not back["metadata"].get("finalizers")
    assert (
        events_a[-2]["object"]["metadata"]["resourceVersion"]
        == (back["metadata"]["resourceVersion"])
    )
    assert [e["type"] for e in events_ab] == ["ADDED"]
    code, obj = await world.call("GET", world.url("a", "back"))
    assert code == 200 and not obj["metadata"].get("deletionTimestamp")


async def test_overlapping_slices_share_an_object_that_stays_in_both(world: World) -> None:
    await held_by_a(world, "both")
    code, _ = await world.call("GET", world.url("ab", "both"))
    assert code == 200
    world.relabel("both", region="b")
    await leaving_a_shown(world, "both")
    # ab still matches, but a (a holder) stopped matching: ab waits like b.
    code, _ = await world.call("GET", world.url("ab", "both"))
    assert code == 404


async def leaving_a_shown(world: World, name: str) -> None:
    async def shown() -> bool:
        code, obj = await world.call("GET", world.url("a", name))
        return code == 200 and bool(obj["metadata"].get("deletionTimestamp"))

    await eventually("a shows it leaving", shown)


async def test_a_real_deletion_shows_as_itself(world: World) -> None:
    await leaving_a(world, "gone")
    code, _ = await world.call("DELETE", world.url("a-direct", "gone"))
    assert code == 404  # a-direct matches region=a only: the object is not in it
    since = holds_of(world.stored("gone"))[f"{SLICE_CLUSTER}/a"]["leavingSince"]
    direct = f"{world.upstream}/clusters/c1/apis/example.io/v1alpha1/namespaces/ns1/widgets/gone"
    headers = {"Authorization": f"Bearer {PROXY_TOKEN}"}
    async with world.session.delete(direct, headers=headers) as r:
        assert r.status == 200, await r.text()
    deleted_at = world.stored("gone")["metadata"]["deletionTimestamp"]

    async def real() -> bool:
        code, shown = await world.call("GET", world.url("a", "gone"))
        return code == 200 and shown["metadata"]["deletionTimestamp"] == deleted_at

    await eventually("a shows kcp's own deletionTimestamp", real)
    # a's release lets the upstream finish the deletion.
    code, body = await world.call(
        "PATCH",
        world.url("a", "gone"),
        [{"op": "remove", "path": "/metadata/finalizers/0"}],
        content_type=JSON_PATCH,
    )
    assert code == 200, body
    assert world.fake.get(cluster="c1", namespace="ns1", name="gone") is None
    assert since


async def test_the_release_annotation_ends_a_hold(world: World) -> None:
    await leaving_a(world, "stuck")

    async def counted_stuck() -> bool:
        stuck = world.handoff.stuck(f"{SLICE_CLUSTER}/a")
        return stuck is not None and stuck.count == 1

    await eventually("counted as stuck after stuck_after", counted_stuck)
    assert world.handoff.stuck(f"{SLICE_CLUSTER}/b") is None
    world.annotate("stuck", RELEASE_ANNOTATION, f"{SLICE_CLUSTER}/a")

    async def released() -> bool:
        meta = world.stored("stuck")["metadata"]
        annotations = meta.get("annotations") or {}
        return (
            not meta.get("finalizers")
            and HOLDS_ANNOTATION not in annotations
            and RELEASE_ANNOTATION not in annotations
        )

    await eventually("released", released)
    code, obj = await world.call("GET", world.url("b", "stuck"))
    assert code == 200 and not obj["metadata"].get("deletionTimestamp")
    assert b'vwserver_handoff_holds_ended_total{reason="released"} 1.0' in world.metrics.render()


@pytest.mark.parametrize("world", [(1.0, 0.05)], ids=["timeout"], indirect=True)
async def test_a_hold_timeout_ends_a_stuck_hold(world: World) -> None:
    await leaving_a(world, "slow")

    async def ended() -> bool:
        return not world.stored("slow")["metadata"].get("finalizers")

    await eventually("the timeout ended the hold", ended)
    assert b'vwserver_handoff_holds_ended_total{reason="timeout"} 1.0' in world.metrics.render()


async def _true(value: bool) -> bool:
    return value


async def _events(
    response: aiohttp.ClientResponse, *, until: Callable[[dict[str, Any]], bool]
) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(WAIT):
        while True:
            line = await response.content.readline()
            assert line, "the watch ended"
            event = json.loads(line)
            if event["type"] == "BOOKMARK":
                continue
            events.append(event)
            if until(event):
                return events


APPLY = "application/apply-patch+yaml"


async def test_server_side_apply_records_keeps_and_releases_holds(world: World) -> None:
    code, _ = await world.call("GET", world.url("a"))
    assert code == 200
    url = world.url("a", "applied") + "?fieldManager=ctl"
    config = widget("applied", region="a")
    config["metadata"]["finalizers"] = [FIN_A]
    code, body = await world.call("PATCH", url, config, content_type=APPLY)
    assert code in (200, 201), body
    assert holds_of(world.stored("applied")) == {f"{SLICE_CLUSTER}/a": {"finalizers": [FIN_A]}}
    # A later apply that does not mention the annotation keeps it (the proxy states it).
    config["spec"] = {"size": 2}
    code, body = await world.call("PATCH", url, config, content_type=APPLY)
    assert code == 200, body
    assert holds_of(world.stored("applied")) == {f"{SLICE_CLUSTER}/a": {"finalizers": [FIN_A]}}
    # An apply without the finalizer releases it, and the hold with it.
    config["metadata"]["finalizers"] = []
    code, body = await world.call("PATCH", url, config, content_type=APPLY)
    assert code == 200, body
    stored = world.stored("applied")
    assert not stored["metadata"].get("finalizers")
    # Whether the apply drops the annotation is the apiserver's field ownership (kcp drops what
    # only this manager configured); an entry left behind holds nothing.
    assert (
        effective_holds(stored["metadata"].get("annotations"), stored["metadata"].get("finalizers"))
        == {}
    )
    code, obj = await world.call("GET", world.url("b", "applied"))
    assert code == 404  # region=a: b never sees it; a sees it as a plain object
    code, obj = await world.call("GET", world.url("a", "applied"))
    assert code == 200 and not obj["metadata"].get("deletionTimestamp")


@pytest.mark.parametrize("world", [(None, 3600.0)], ids=["rare-scans"], indirect=True)
async def test_a_read_that_finds_an_unrecorded_move_has_it_recorded_at_once(world: World) -> None:
    """The loop scans rarely here; the read that shows the slice an object leaving it without
    a recorded time wakes it, and the deletion shows one write later."""
    await asyncio.sleep(0.2)  # the loop's first scan (of nothing) is behind it
    await leaving_a(world, "quick")


async def test_lists_kcp_answers_show_the_leaving_object_too(world: World) -> None:
    """A LIST the cache leaves to kcp (here: a namespace field selector; also a consistent
    read the cache cannot catch up with) asks kcp without the slice's selector and decides
    membership itself: the leaving object is there, being deleted; the arriving one is not."""
    shown = await leaving_a(world, "via-kcp")
    since = shown["metadata"]["deletionTimestamp"]
    query = {"fieldSelector": "metadata.namespace=ns1", "limit": "1"}
    names: list[str] = []
    deletions: list[str | None] = []
    token = ""
    while True:
        params = {**query, "continue": token} if token else query
        code, page = await world.call_with("GET", world.everywhere("a"), params)
        assert code == 200, page
        names += [i["metadata"]["name"] for i in page["items"]]
        deletions += [i["metadata"].get("deletionTimestamp") for i in page["items"]]
        token = page["metadata"].get("continue", "")
        if not token:
            break
    assert names == ["via-kcp"] and deletions == [since]
    code, page = await world.call_with(
        "GET", world.everywhere("b"), {"fieldSelector": "metadata.namespace=ns1"}
    )
    assert code == 200 and page["items"] == []


async def test_a_watch_from_a_version_the_cache_has_not_reached_is_served_from_it(
    world: World,
) -> None:
    """An informer that listed from kcp (a consistent LIST the cache could not catch up with)
    watches from a resourceVersion newer than the cache's: served from the cache — whose views
    show objects leaving the slice — skipping the changes up to it, rather than by kcp.

    The upstream is at that resourceVersion (a resourceVersion newer than the upstream's own is
    another shard's: 410, tests/shards/test_foreign_shards.py): a widget the client "already
    has", then a write of another resource (an APIBinding), which moves the upstream's revision
    but not the widgets' stream — as every other resource of a kcp shard does."""
    code, listed = await world.call("GET", world.url("a"))
    assert code == 200
    now = int(listed["metadata"]["resourceVersion"])
    world.fake.create(cluster="c1", obj=widget("ahead-0", region="a"))
    world.fake.bind(cluster="rv-elsewhere")
    ahead = now + 2  # the two changes the client "already has"
    async with world.session.get(
        world.url("a"), params={"watch": "1", "resourceVersion": str(ahead)}
    ) as watch:
        for i in (1, 2):
            world.fake.create(cluster="c1", obj=widget(f"ahead-{i}", region="a"))
        events = await _events(watch, until=lambda e: e["type"] == "ADDED")
    assert [e["object"]["metadata"]["name"] for e in events] == ["ahead-1"]
    assert int(events[0]["object"]["metadata"]["resourceVersion"]) > ahead
    # kcp did not answer it (a fallback is counted when it happens; a served watch when it ends)
    fallback = b'vwserver_cache_reads_total{outcome="fallback",verb="watch"} '
    assert not any(
        line.startswith(fallback) and float(line[len(fallback) :]) > 0
        for line in world.metrics.render().splitlines()
    )


async def test_a_client_page_kcp_answers_is_filled_to_its_limit(world: World) -> None:
    """kcp is asked without the slice's selector, so its pages hold objects of other slices:
    the proxy fills the client's page to its limit from further upstream pages (as the
    apiserver fills a page with what its predicate takes), then hands out kcp's token."""
    for i in range(6):
        world.fake.create(cluster="c1", obj=widget(f"other-{i}", region="b"))
        world.fake.create(cluster="c1", obj=widget(f"mine-{i}", region="a"))
    query = {"fieldSelector": "metadata.namespace=ns1", "limit": "4"}
    names: list[str] = []
    token = ""
    pages = 0
    while True:
        params = {**query, "continue": token} if token else query
        code, page = await world.call_with("GET", world.everywhere("a"), params)
        assert code == 200, page
        pages += 1
        items = [i["metadata"]["name"] for i in page["items"]]
        token = page["metadata"].get("continue", "")
        assert len(items) == 4 or not token, items  # full pages, but the last
        names += items
        if not token:
            break
    assert sorted(names) == [f"mine-{i}" for i in range(6)] and pages == 2


# --- a client's own selector, and what the holding slice may ever observe -------------------------


async def test_a_client_selecting_by_the_slices_label_sees_the_deletion(world: World) -> None:
    """A client whose own labelSelector is the slice's label (controller-runtime's ByObject
    label selectors) gets the leaving object being deleted — in its watch, its LIST from the
    cache and a LIST kcp answers — never a plain DELETED with its finalizer still on; after the
    release, DELETED."""
    own = {"labelSelector": "region=a"}
    code, _ = await world.call("GET", world.url("a"))
    assert code == 200
    async with world.session.get(world.url("a"), params={"watch": "1", **own}) as watch:
        shown = await leaving_a(world, "selected")
        since = shown["metadata"]["deletionTimestamp"]
        leaving = await _events(
            watch, until=lambda e: bool(e["object"]["metadata"].get("deletionTimestamp"))
        )
        assert [e["type"] for e in leaving] == ["ADDED", "MODIFIED"], leaving
        assert leaving[-1]["object"]["metadata"]["labels"]["region"] == "b"
        for url, params in (
            (world.url("a"), own),
            (world.everywhere("a"), {**own, "fieldSelector": "metadata.namespace=ns1"}),  # kcp
            (world.everywhere("a"), {"labelSelector": "region=a,app notin (x)"}),
        ):
            code, listed = await world.call_with("GET", url, params)
            assert code == 200, listed
            assert [i["metadata"].get("deletionTimestamp") for i in listed["items"]] == [since]
        # a selector the labels before the move did not match still does not take it
        code, listed = await world.call_with("GET", world.url("a"), {"labelSelector": "region=b"})
        assert listed["items"] == []
        release = json.loads(json.dumps(shown))
        release["metadata"]["finalizers"] = []
        code, _ = await world.call("PUT", world.url("a", "selected"), release)
        assert code == 200
        gone = await _events(watch, until=lambda e: e["type"] == "DELETED")
    assert [e["type"] for e in gone] == ["DELETED"]
    assert gone[0]["object"]["metadata"]["deletionTimestamp"] == since
    assert holds_of(world.stored("selected")) == {}


@pytest.mark.parametrize("seed", range(4))
async def test_random_moves_never_show_the_holder_its_object_outside_it_undeleted(
    world: World, seed: int
) -> None:
    """Random relabels (between a, b, c and no region; at once or after a pause, before and
    after the move was recorded) and releases of an object a holds, while a's watches (one
    with a's own label as its selector), LISTs and GETs read it: a never observes it outside
    region=a without a deletionTimestamp, and once a deletion was shown it stays until a
    DELETED. Moves of several objects race the handoff loop's recording write."""
    rng = random.Random(seed)
    names = [f"r{seed}-{i}" for i in range(3)]
    code, _ = await world.call("GET", world.url("a"))
    assert code == 200
    problems: list[str] = []

    def check(where: str, item: dict[str, Any]) -> None:
        meta = item["metadata"]
        if meta.get("labels", {}).get("region") != "a" and not meta.get("deletionTimestamp"):
            problems.append(f"{where}: {meta['name']} outside a without a deletion: {meta}")

    async def watch(params: dict[str, str], stop: asyncio.Event) -> None:
        deleting: set[str] = set()
        async with world.session.get(world.url("a"), params={"watch": "1", **params}) as r:
            while not stop.is_set():
                try:
                    async with asyncio.timeout(0.2):
                        line = await r.content.readline()
                except TimeoutError:
                    continue
                if not line:
                    return
                event = json.loads(line)
                obj, name = event["object"], event["object"]["metadata"]["name"]
                if event["type"] == "DELETED":
                    deleting.discard(name)
                    continue
                check(f"watch {params}", obj)
                if obj["metadata"].get("deletionTimestamp"):
                    deleting.add(name)
                elif name in deleting:
                    problems.append(f"watch {params}: {name}'s deletionTimestamp went away")

    async def reads(stop: asyncio.Event) -> None:
        while not stop.is_set():
            code, listed = await world.call("GET", world.url("a"))
            for item in listed.get("items", []):
                check("list", item)
            for name in names:
                code, obj = await world.call("GET", world.url("a", name))
                if code == 200:
                    check("get", obj)
            await asyncio.sleep(0.01)

    stop = asyncio.Event()
    readers = [
        asyncio.ensure_future(watch({}, stop)),
        asyncio.ensure_future(watch({"labelSelector": "region=a"}, stop)),
        asyncio.ensure_future(reads(stop)),
    ]
    try:
        await asyncio.sleep(0.1)
        for name in names:
            await held_by_a(world, name)
        for _ in range(12):
            name = rng.choice(names)
            step = rng.choice(["relabel", "relabel", "release", "pause"])
            if step == "relabel":
                world.relabel(name, region=rng.choice(["a", "b", "c", "x"]))
            elif step == "release":
                code, obj = await world.call("GET", world.url("a", name))
                if code == 200 and obj["metadata"].get("deletionTimestamp"):
                    obj["metadata"]["finalizers"] = []
                    await world.call("PUT", world.url("a", name), obj)
            else:
                await asyncio.sleep(rng.choice([0.0, 0.05, 0.2]))
        await asyncio.sleep(0.3)
    finally:
        stop.set()
        await asyncio.gather(*readers)
    assert not problems, problems[:5]
