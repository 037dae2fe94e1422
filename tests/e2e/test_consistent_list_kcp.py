"""Consistent LISTs through a cached slice against the session's kcp: never older than a write
that completed before the read started, and continued correctly by a watch from their
resourceVersion.

A consistent LIST (no resourceVersion; what ``kubectl get`` sends) is served from the shared
cache only when the reflector's own stream has reached kcp's current resourceVersion, read with
a one-item LIST (vwserver/proxy/cached.py, FRESHNESS_WAIT, states the kcp facts the proof rests
on); otherwise kcp answers. The tests write — directly to kcp and through
the slice — then list through the slice at once, many times, while other writes move kcp's
resourceVersion without an event on this resource: ConfigMaps in another workspace, and
widgets of another workspace (other objects of the same resource). Each list must show the
write. ``VWSERVER_CONSISTENT_ITERATIONS`` sets how many (default 240; the full run is 2400).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from devenv.bootstrap import Bootstrap
from devenv.kcp import KcpInstance
from tests.support.cache import cache_reads
from tests.support.rest import MERGE_PATCH
from tests.support.slices import slice_url, slices_over_kcp
from tests.support.upstream_record import RecordingUpstream
from vwserver.selector import Selector

ITERATIONS = int(os.environ.get("VWSERVER_CONSISTENT_ITERATIONS", "240"))
OTHER_ITERATIONS = int(os.environ.get("VWSERVER_CONSISTENT_OTHER_ITERATIONS", "1000"))
PARTIAL = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
ACCEPTS = ("application/json", PARTIAL, TABLE)
NAMESPACE = "default"
NOTHING_SELECTOR = "vwserver.kcp.io/freshness-probe,!vwserver.kcp.io/freshness-probe"
"""A label selector no object can match: the key present and absent."""


@dataclass(frozen=True)
class Serving:
    """A vwserver serving slice ``prod`` (``env=prod``) from its cache, and the sessions."""

    base: str
    proxy: aiohttp.ClientSession
    direct: aiohttp.ClientSession
    listing: str  # the slice's LIST of widgets on every consumer


@contextlib.asynccontextmanager
async def _serving(kcp: KcpInstance, world: Bootstrap, **options: Any) -> AsyncIterator[Serving]:
    async with (
        slices_over_kcp(
            kcp,
            world,
            slices={"prod": Selector.parse("env=prod")},
            page_size=500,
            cache=True,
            **options,
        ) as base,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as proxy,
        kcp.http_session() as direct,
    ):
        listing = f"{slice_url(base, world, 'prod', '*')}/{world.api_path}/{world.resource}"
        yield Serving(base, proxy, direct, listing)


def _widget(world: Bootstrap, name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": f"{world.group}/{world.version}",
        "kind": "Widget",
        "metadata": {"name": name, "labels": labels},
    }


def _items(doc: dict[str, Any]) -> list[dict[str, Any]]:
    if doc["kind"] == "Table":
        return [row["object"] for row in doc["rows"]]
    items: list[dict[str, Any]] = doc["items"]
    return items


def _rv(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


@contextlib.asynccontextmanager
async def _churn(
    kcp: KcpInstance,
    world: Bootstrap,
    *,
    widgets: bool = True,
    burst: int = 0,
    pause: float = 0.0,
) -> AsyncIterator[list[int]]:
    """Writes to other resources and other objects while the block runs: ConfigMaps and (with
    ``widgets``) widgets in the second consumer's workspace (none of them in the test's
    selection); ConfigMaps back to back, or (``burst``) that many create+delete pairs, then
    ``pause`` seconds without. Yields the count of writes made, [configmaps, widgets]."""
    ws = world.consumers[1]
    made = [0, 0]
    stop = asyncio.Event()

    async def configmaps(session: aiohttp.ClientSession) -> None:
        url = f"{ws.url}/api/v1/namespaces/{NAMESPACE}/configmaps"
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "churn-"}}
        while not stop.is_set():
            async with session.post(url, json=body) as r:
                assert r.status == 201, await r.text()
                name = (await r.json())["metadata"]["name"]
            async with session.delete(f"{url}/{name}") as r:
                assert r.status == 200, await r.text()
            made[0] += 2
            if burst and made[0] % (2 * burst) == 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), pause)

    async def other_widgets(session: aiohttp.ClientSession) -> None:
        url = f"{ws.url}/{world.api_path}/namespaces/{NAMESPACE}/{world.resource}"
        name = f"churn-{uuid.uuid4().hex[:6]}"
        body = _widget(world, name, {"env": "dev"})
        async with session.post(url, json=body) as r:
            assert r.status == 201, await r.text()
        try:
            size = 0
            while not stop.is_set():
                size += 1
                patch = json.dumps({"spec": {"size": size}})
                headers = {"Content-Type": MERGE_PATCH}
                async with session.patch(f"{url}/{name}", data=patch, headers=headers) as r:
                    assert r.status == 200, await r.text()
                made[1] += 1
                await asyncio.sleep(0.02)
        finally:
            async with session.delete(f"{url}/{name}") as r:
                await r.read()

    async with kcp.http_session() as session:
        tasks = [asyncio.create_task(configmaps(session))]
        if widgets:
            tasks.append(asyncio.create_task(other_widgets(session)))
        try:
            yield made
        finally:
            stop.set()
            await asyncio.gather(*tasks)


async def test_kcp_s_current_resource_version_is_at_least_every_completed_write(
    kcp: KcpInstance, world: Bootstrap
) -> None:
    """Both cheap reads of kcp's current resourceVersion — a one-item LIST (what the cache
    uses) and a consistent watch-list whose selector matches nothing (it answers with the
    initial-events-end bookmark alone) — are at least the resourceVersion of every write
    completed before them, to this resource or any other."""
    ws = world.consumers[1]
    collection = f"{world.vw_url}/clusters/*/{world.api_path}/{world.resource}"
    probe = {
        "watch": "1",
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "allowWatchBookmarks": "true",
        "labelSelector": NOTHING_SELECTOR,
        "timeoutSeconds": "5",
    }
    cm_url = f"{ws.url}/api/v1/namespaces/{NAMESPACE}/configmaps"
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "probe-"}}
    async with kcp.http_session() as session:
        for _ in range(20):
            async with session.post(cm_url, json=body) as r:
                assert r.status == 201, await r.text()
                written = await r.json()
            async with session.get(collection, params=probe) as r:
                assert r.status == 200, await r.text()
                first = json.loads(await r.content.readline())
            async with session.get(collection, params={"limit": "1"}) as r:
                assert r.status == 200, await r.text()
                assert _rv(await r.json()) >= _rv(written)
            async with session.delete(f"{cm_url}/{written['metadata']['name']}") as r:
                assert r.status == 200
            assert first["type"] == "BOOKMARK", first
            meta = first["object"]["metadata"]
            assert meta["annotations"]["k8s.io/initial-events-end"] == "true"
            assert int(meta["resourceVersion"]) >= _rv(written)


@dataclass
class Rounds:
    """What a run of write-then-list rounds saw."""

    stale: list[str] = field(default_factory=list)
    served: float = 0.0
    fallback: float = 0.0


async def _write_then_list(
    kcp: KcpInstance, world: Bootstrap, on: Serving, *, iterations: int
) -> Rounds:
    """``iterations`` rounds: a write of a widget of this run (create, update, delete; directly
    to kcp or through the slice), then at once a consistent LIST through the slice (objects,
    PartialObjectMetadata, Table in turn), which must show it."""
    base, proxy, direct, listing = on.base, on.proxy, on.direct, on.listing
    run = uuid.uuid4().hex[:6]
    home = world.consumers[0]
    selector = f"fresh={run}"
    through_slice = f"{slice_url(base, world, 'prod', home.cluster)}/{world.api_path}"
    via = {"kcp": (direct, f"{home.url}/{world.api_path}"), "slice": (proxy, through_slice)}
    async with proxy.get(listing, params={"resourceVersion": "0"}) as r:
        assert r.status == 200  # the cache synced (or kcp answered while it lists)
    seen = Rounds()
    served = await cache_reads(proxy, base, verb="list", outcome="served")
    fallback = await cache_reads(proxy, base, verb="list", outcome="fallback")
    try:
        await _rounds(world, proxy, listing, via, run=run, iterations=iterations, seen=seen)
    finally:
        # Other modules share this world (the syncer's count its widgets): none of this run's
        # is left, whatever round the loop ended at (a count not a multiple of 3 ends on a create).
        async with direct.delete(via["kcp"][1] + f"/namespaces/{NAMESPACE}/{world.resource}",
                                 params={"labelSelector": selector}) as r:  # fmt: skip
            assert r.status == 200, await r.text()
    seen.served = await cache_reads(proxy, base, verb="list", outcome="served") - served
    seen.fallback = await cache_reads(proxy, base, verb="list", outcome="fallback") - fallback
    return seen


async def _rounds(
    world: Bootstrap,
    proxy: aiohttp.ClientSession,
    listing: str,
    via: dict[str, tuple[aiohttp.ClientSession, str]],
    *,
    run: str,
    iterations: int,
    seen: Rounds,
) -> None:
    selector = f"fresh={run}"
    for i in range(iterations):
        op = ("create", "update", "delete")[i % 3]
        path = "kcp" if (i // 3) % 2 == 0 else "slice"
        session, prefix = via[path]
        name = f"fresh-{run}-{i // 3}"
        url = f"{prefix}/namespaces/{NAMESPACE}/{world.resource}"
        if op == "create":
            body = _widget(world, name, {"env": "prod", "fresh": run})
            async with session.post(url, json=body) as r:
                assert r.status == 201, await r.text()
                written: int | None = _rv(await r.json())
        elif op == "update":
            patch = json.dumps({"spec": {"size": i}})
            headers = {"Content-Type": MERGE_PATCH}
            async with session.patch(f"{url}/{name}", data=patch, headers=headers) as r:
                assert r.status == 200, await r.text()
                written = _rv(await r.json())
        else:
            async with session.delete(f"{url}/{name}") as r:
                assert r.status == 200, await r.text()
            written = None
        accept = ACCEPTS[i % len(ACCEPTS)]
        params = {"labelSelector": selector}
        async with proxy.get(listing, params=params, headers={"Accept": accept}) as r:
            assert r.status == 200, await r.text()
            doc = json.loads(await r.read())
        found = {o["metadata"]["name"]: _rv(o) for o in _items(doc)}
        if written is None and name in found:
            seen.stale.append(f"{i}: {name} deleted via {path}, still listed ({accept})")
        elif written is not None and found.get(name, -1) < written:
            seen.stale.append(
                f"{i}: {op} of {name} via {path} at {written}, listed "
                f"{found.get(name, 'absent')} ({accept})"
            )


@pytest.mark.timeout(120 + ITERATIONS)  # a round takes ~0.1-0.3 s on the test machine
async def test_a_consistent_list_is_never_older_than_a_completed_write(
    kcp: KcpInstance, world: Bootstrap, observe: Any
) -> None:
    async with _serving(kcp, world) as on, _churn(kcp, world) as made:
        seen = await _write_then_list(kcp, world, on, iterations=ITERATIONS)
    observe(
        f"{ITERATIONS} write-then-list rounds: {seen.served:.0f} from the cache, "
        f"{seen.fallback:.0f} from kcp; other writes meanwhile: {made[0]} configmaps, "
        f"{made[1]} widgets"
    )
    assert not seen.stale, f"{len(seen.stale)} stale lists, first: {seen.stale[:5]}"
    assert seen.served + seen.fallback == ITERATIONS
    # The other workspace's widget writes keep the cache's own stream moving: the proof holds
    # for most reads (so both paths were checked).
    assert seen.served > 0


@pytest.mark.timeout(180 + OTHER_ITERATIONS)
async def test_under_writes_to_other_resources_only_the_list_is_never_older_than_a_write(
    kcp: KcpInstance, world: Bootstrap, observe: Any
) -> None:
    """The same rounds while only *other* resources are written besides the test's own widgets
    — ConfigMaps in another workspace, in bursts with pauses — so kcp's resourceVersion runs
    ahead of the cache's stream without an event on it: the reads kcp answers ask the reflector
    for progress (short watches, vwserver/k8s/progress.py), whose bookmarks let the cache prove
    itself again. Every list shows the write before it; every upstream LIST the proxy sent for
    the slice (a slice that records holds) named it by a selector."""
    sent: list[RecordingUpstream] = []

    def upstream(**kw: Any) -> RecordingUpstream:
        sent.append(RecordingUpstream(**kw))
        return sent[-1]

    async with (
        _serving(kcp, world, upstream=upstream) as on,
        _churn(kcp, world, widgets=False, burst=20, pause=1.0) as made,
    ):
        seen = await _write_then_list(kcp, world, on, iterations=OTHER_ITERATIONS)
    lists = [q for recording in sent for q in recording.lists(world.resource)]
    observe(
        f"{OTHER_ITERATIONS} write-then-list rounds: {seen.served:.0f} from the cache, "
        f"{seen.fallback:.0f} from kcp; {made[0]} configmap writes meanwhile; "
        f"{len(lists)} upstream LISTs of widgets by the proxy"
    )
    assert not seen.stale, f"{len(seen.stale)} stale lists, first: {seen.stale[:5]}"
    assert seen.served + seen.fallback == OTHER_ITERATIONS
    assert made[0] > 0
    # kcp answered some (the configmap bursts) and the cache the rest: both paths were checked
    assert seen.served > 0 and seen.fallback > 0
    # No unfiltered upstream LIST: the freshness read asks for one object, every other LIST
    # (the fallbacks' two streams, selected and held) carries a label selector.
    unfiltered = [q for q in lists if not q.get("labelSelector") and q.get("limit") != "1"]
    assert not unfiltered, unfiltered[:3]
    assert any(q.get("labelSelector") for q in lists)


async def test_a_read_that_found_kcp_ahead_is_proven_from_the_cache_soon(
    kcp: KcpInstance, world: Bootstrap, observe: Any
) -> None:
    """After a write to another resource kcp's resourceVersion is ahead of the cache's stream,
    which has no event to get there: without progress on demand only kcp's periodic bookmark
    (about one a minute) would let the cache prove a consistent read again. Three times in a
    row, each after a ConfigMap write, consistent LISTs through the slice are served from the
    cache again within 20 s (kcp's pre-deadline bookmark of a short watch; at most one round
    could be met by a periodic one)."""
    ws = world.consumers[1]
    cm_url = f"{ws.url}/api/v1/namespaces/{NAMESPACE}/configmaps"
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "ahead-"}}
    took: list[float] = []
    async with _serving(kcp, world) as on:
        base, proxy, direct, listing = on.base, on.proxy, on.direct, on.listing
        async with proxy.get(listing, params={"resourceVersion": "0"}) as r:
            assert r.status == 200
        loop = asyncio.get_running_loop()
        for _ in range(3):
            async with direct.post(cm_url, json=body) as r:
                assert r.status == 201, await r.text()
                cm = await r.json()
            written = _rv(cm)
            started = loop.time()
            served = await cache_reads(proxy, base, verb="list", outcome="served")
            async with asyncio.timeout(20):
                while True:
                    async with proxy.get(listing) as r:
                        assert r.status == 200, await r.text()
                        listed = _rv(json.loads(await r.read()))
                    assert listed >= written  # never older than the write before it
                    if await cache_reads(proxy, base, verb="list", outcome="served") > served:
                        break
                    await asyncio.sleep(0.1)
            took.append(loop.time() - started)
            async with direct.delete(f"{cm_url}/{cm['metadata']['name']}") as r:
                assert r.status == 200, await r.text()
    observe(f"served from the cache again after {', '.join(f'{t:.1f}' for t in took)} s")


async def test_a_watch_from_a_consistent_list_continues_it(
    kcp: KcpInstance, world: Bootstrap, observe: Any
) -> None:
    """client-go's list-then-watch through the slice: every change after the list exactly
    once, nothing from before it — whether the list came from the cache or from kcp (rounds
    with and without other writes meanwhile)."""
    run = uuid.uuid4().hex[:6]
    home = world.consumers[0]
    url = f"{home.url}/{world.api_path}/namespaces/{NAMESPACE}/{world.resource}"
    paths: list[str] = []
    async with _serving(kcp, world) as on:
        base, proxy, direct, listing = on.base, on.proxy, on.direct, on.listing
        for round_ in range(6):
            churn = _churn(kcp, world) if round_ % 2 else contextlib.nullcontext([0, 0])
            async with churn:
                names = [f"lw-{run}-{round_}-{n}" for n in range(2)]
                for name in names:
                    body = _widget(world, name, {"env": "prod", "fresh": run})
                    async with direct.post(url, json=body) as r:
                        assert r.status == 201, await r.text()
                served = await cache_reads(proxy, base, verb="list", outcome="served")
                params = {"labelSelector": f"fresh={run}"}
                async with proxy.get(listing, params=params) as r:
                    assert r.status == 200, await r.text()
                    listed = json.loads(await r.read())
                after = await cache_reads(proxy, base, verb="list", outcome="served")
                paths.append("cache" if after > served else "kcp")
                present = {o["metadata"]["name"] for o in listed["items"]}
                assert set(names) <= present
                watch = {
                    "watch": "1",
                    "resourceVersion": listed["metadata"]["resourceVersion"],
                    "labelSelector": f"fresh={run}",
                    "timeoutSeconds": "30",
                }
                seen: list[tuple[str, str]] = []
                async with proxy.get(listing, params=watch) as r:
                    assert r.status == 200
                    later = f"lw-{run}-{round_}-later"
                    body = _widget(world, later, {"env": "prod", "fresh": run})
                    async with direct.post(url, json=body) as w:
                        assert w.status == 201
                    patch = json.dumps({"spec": {"size": 3}})
                    headers = {"Content-Type": MERGE_PATCH}
                    async with direct.patch(f"{url}/{names[0]}", data=patch, headers=headers) as w:
                        assert w.status == 200
                    for name in [*names, later]:
                        async with direct.delete(f"{url}/{name}") as w:
                            assert w.status == 200
                    async with asyncio.timeout(30):
                        async for line in r.content:
                            event = json.loads(line)
                            if event["type"] == "BOOKMARK":
                                continue
                            seen.append((event["type"], event["object"]["metadata"]["name"]))
                            if len(seen) == 5:
                                break
                assert seen == [
                    ("ADDED", later),
                    ("MODIFIED", names[0]),
                    ("DELETED", names[0]),
                    ("DELETED", names[1]),
                    ("DELETED", later),
                ], (round_, paths[-1])
    observe(f"lists answered by: {paths}")
