"""A consistent LIST (no resourceVersion) from the shared cache only when it is proven current.

The proof (vwserver/proxy/cached.py, ``ready``): kcp's current resourceVersion X from a
one-item LIST, and the reflector's own stream at X or beyond. Against the fake upstream, which like kcp keeps one
resourceVersion counter for every resource (etcd's revision) and sends periodic bookmarks
(here: not within the test), counted by the fake's request log:

* proven: one one-item LIST upstream, no other — also for PartialObjectMetadata and Tables, and for
  every page of a paged read (the continue token carries the first page's resourceVersion);
* a write to another resource moves X past anything this resource's stream can show: the
  pass-through answers, with the write of this resource that completed before the read;
* the list's resourceVersion continues as a watch: list, then watch from it, nothing missed,
  nothing twice.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fakekcp.store import ResourceSpec
from fakekcp.upstream import FakeUpstream
from tests.integration.conftest import PROXY_TOKEN, SLICE_CLUSTER, routes_for, widget
from tests.support.cache import CachedProxy, cache_reads, cached_proxy

WIDGETS = "/apis/example.io/v1alpha1/widgets"
PARTIAL = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
GADGET = ResourceSpec(plural="gadgets", kind="Gadget")


def gadget(name: str) -> dict[str, Any]:
    """An object of the other resource: its write moves the shared resourceVersion."""
    meta = {"name": name, "namespace": "ns1"}
    return {"apiVersion": "example.io/v1alpha1", "kind": "Gadget", "metadata": meta}


def seed(fake: FakeUpstream) -> None:
    for i in range(5):
        fake.create(cluster="c1", obj=widget(f"w{i}", env="prod" if i % 2 == 0 else "dev"))


@pytest.fixture
async def proxy() -> AsyncIterator[CachedProxy]:
    async with cached_proxy(
        # No periodic bookmark during a test: the reflector's stream moves only with events.
        FakeUpstream(bookmark_interval=600, resources=[ResourceSpec(), GADGET]),
        routes=routes_for,
        token=PROXY_TOKEN,
        within=30,
        seed=seed,
        world=CachedProxy,
    ) as world:
        yield world


def url(proxy: CachedProxy, path: str = WIDGETS) -> str:
    return f"{proxy.base}/services/filtered-apiexport/{SLICE_CLUSTER}/prod/clusters/*{path}"


def upstream_reads(proxy: CachedProxy) -> list[dict[str, str]]:
    return [r.query for r in proxy.fake.faults.requests if r.method == "GET"]


def is_probe(query: dict[str, str]) -> bool:
    """The read of the upstream's current resourceVersion: one item, no selector."""
    return query == {"limit": "1"}


def is_list(query: dict[str, str]) -> bool:
    """A LIST of the slice's objects (the pass-through's pages)."""
    return query.get("watch") not in ("1", "true") and not is_probe(query)


async def get(proxy: CachedProxy, *, accept: str = "application/json", **params: str) -> Any:
    async with proxy.session.get(url(proxy), params=params, headers={"Accept": accept}) as r:
        assert r.status == 200, await r.text()
        return json.loads(await r.read())


def names(doc: dict[str, Any]) -> list[str]:
    if doc["kind"] == "Table":
        return [row["object"]["metadata"]["name"] for row in doc["rows"]]
    return [item["metadata"]["name"] for item in doc["items"]]


async def synced(proxy: CachedProxy) -> None:
    """The first read syncs the cache (and may fall back while it lists)."""
    await get(proxy, resourceVersion="0")


@pytest.mark.parametrize("accept", ["application/json", PARTIAL, TABLE])
async def test_a_proven_consistent_list_asks_kcp_for_one_item_only(
    proxy: CachedProxy, accept: str
) -> None:
    await get(proxy, accept=accept, resourceVersion="0")
    proxy.fake.create(cluster="c1", obj=widget("fresh", env="prod"))
    served = await cache_reads(proxy.session, proxy.base, verb="list", outcome="served")
    before = len(upstream_reads(proxy))
    doc = await get(proxy, accept=accept)
    assert names(doc) == ["fresh", "w0", "w2", "w4"]
    assert int(doc["metadata"]["resourceVersion"]) >= proxy.fake.resource_version
    asked = upstream_reads(proxy)[before:]
    assert len(asked) == 1 and is_probe(asked[0]), asked
    after = await cache_reads(proxy.session, proxy.base, verb="list", outcome="served")
    assert after == served + 1


async def test_every_page_of_a_proven_read_is_the_cache_s(proxy: CachedProxy) -> None:
    await synced(proxy)
    before = len(upstream_reads(proxy))
    first = await get(proxy, limit="2")
    token = first["metadata"]["continue"]
    rest = await get(proxy, limit="2", **{"continue": token})
    assert names(first) + names(rest) == ["w0", "w2", "w4"]
    asked = upstream_reads(proxy)[before:]
    assert len(asked) == 1 and is_probe(asked[0]), asked  # the first page's proof only


async def test_a_write_to_another_resource_sends_the_read_to_kcp(proxy: CachedProxy) -> None:
    """The other resource's write moves kcp's resourceVersion without an event on this
    resource's stream: nothing proves the cache current, kcp answers (and includes the write
    to this resource that completed before the read, whatever the cache holds)."""
    await synced(proxy)
    proxy.fake.create(cluster="c1", obj=widget("before", env="prod"))
    proxy.fake.create(cluster="c1", obj=gadget("g"))
    fallbacks = await cache_reads(proxy.session, proxy.base, verb="list", outcome="fallback")
    before = len(upstream_reads(proxy))
    doc = await get(proxy)
    assert "before" in names(doc)
    asked = upstream_reads(proxy)[before:]
    assert is_probe(asked[0]) and any(is_list(q) for q in asked[1:]), asked
    after = await cache_reads(proxy.session, proxy.base, verb="list", outcome="fallback")
    assert after == fallbacks + 1


@pytest.mark.parametrize("other_write", [False, True], ids=["proven", "fallback"])
async def test_a_watch_from_the_list_s_resource_version_continues_it(
    proxy: CachedProxy, other_write: bool
) -> None:
    """client-go's list-then-watch: every change after the list exactly once, none before."""
    await synced(proxy)
    if other_write:
        proxy.fake.create(cluster="c1", obj=gadget("g"))
    listed = await get(proxy)
    rv = listed["metadata"]["resourceVersion"]
    params = {"watch": "1", "resourceVersion": rv, "timeoutSeconds": "5"}
    seen: list[tuple[str, str]] = []
    async with proxy.session.get(url(proxy), params=params) as r:
        assert r.status == 200
        proxy.fake.create(cluster="c1", obj=widget("later", env="prod"))
        w0 = proxy.fake.get(cluster="c1", namespace="ns1", name="w0")
        assert w0 is not None
        w0["spec"]["size"] = 9
        proxy.fake.update(cluster="c1", obj=w0)
        proxy.fake.delete(cluster="c1", namespace="ns1", name="w2")
        async with asyncio.timeout(10):
            async for line in r.content:
                event = json.loads(line)
                if event["type"] == "BOOKMARK":
                    continue
                seen.append((event["type"], event["object"]["metadata"]["name"]))
                if len(seen) == 3:
                    break
    assert seen == [("ADDED", "later"), ("MODIFIED", "w0"), ("DELETED", "w2")]


async def test_a_read_after_an_unproven_one_goes_to_kcp_without_the_freshness_read(
    proxy: CachedProxy,
) -> None:
    """Once a consistent read found kcp ahead of the stream, the next ones cannot be proven
    before the stream moves (kcp's resourceVersion only grows): they go to kcp at once, one
    pass-through and no one-item read. The stream's next event makes the proof worth asking
    for again, and it holds."""
    await synced(proxy)
    proxy.fake.create(cluster="c1", obj=gadget("g"))
    await get(proxy)  # unproven: kcp is ahead of the stream
    before = len(upstream_reads(proxy))
    for _ in range(3):
        assert names(await get(proxy)) == ["w0", "w2", "w4"]
    asked = upstream_reads(proxy)[before:]
    assert asked and not any(is_probe(q) for q in asked), asked
    # An event of this resource after kcp's known resourceVersion: the stream is there.
    proxy.fake.create(cluster="c1", obj=widget("moved", env="prod"))
    served = await cache_reads(proxy.session, proxy.base, verb="list", outcome="served")
    async with asyncio.timeout(10):
        while True:
            before = len(upstream_reads(proxy))
            doc = await get(proxy)
            asked = upstream_reads(proxy)[before:]
            if len(asked) == 1 and is_probe(asked[0]):
                break  # proven: one one-item read, nothing else
            await asyncio.sleep(0.05)  # the event was not on the stream yet
    assert "moved" in names(doc)
    after = await cache_reads(proxy.session, proxy.base, verb="list", outcome="served")
    assert after == served + 1
