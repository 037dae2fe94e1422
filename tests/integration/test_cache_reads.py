"""LIST and WATCH from the shared watch cache answer what the pass-through path answers.

Two vwservers in front of one fake upstream, with the same slices: one serves reads from the
shared cache, the other passes every read to the upstream. Every read below goes to both and the
answers must be equal after normalising what legitimately differs (continue tokens are each
path's own). Then what only the cache does: one upstream watch for many clients, a client that
falls behind is ended and re-watches, 410 for a resourceVersion older than the window.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from fakekcp.upstream import FakeUpstream
from tests.integration.conftest import CLUSTERS, PROXY_TOKEN, SLICE_CLUSTER, routes_for, widget
from tests.support.cache import cached_and_direct
from vwserver.cache.registry import CacheRegistry

WAIT = 10.0
PARTIAL = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"
PARTIAL_ONE = "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"


@dataclass
class Pair:
    fake: FakeUpstream
    cached: str
    direct: str
    session: aiohttp.ClientSession
    registry: CacheRegistry
    cached_health: str

    def url(self, base: str, path: str, *, slice_name: str = "prod", cluster: str = "*") -> str:
        prefix = f"{base}/services/filtered-apiexport/{SLICE_CLUSTER}/{slice_name}"
        return f"{prefix}/clusters/{cluster}{path}"

    async def both(self, path: str, **kwargs: Any) -> tuple[tuple[int, Any], tuple[int, Any]]:
        async def one(base: str) -> tuple[int, Any]:
            async with self.session.get(self.url(base, path), **kwargs) as r:
                return r.status, json.loads(await r.read())

        return await one(self.cached), await one(self.direct)


def seed(fake: FakeUpstream) -> None:
    for cluster in CLUSTERS:
        for i, (env_, region) in enumerate(
            [("prod", "eu"), ("dev", "eu"), ("prod", "us"), ("dev", "us"), ("prod", "eu")]
        ):
            fake.create(
                cluster=cluster,
                obj=widget(f"w{i}", ns="ns1" if i < 3 else "ns2", env=env_, region=region),
            )


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    upstream = FakeUpstream(bookmark_interval=0.2, history_size=50)
    async with cached_and_direct(upstream, routes=routes_for, token=PROXY_TOKEN, seed=seed) as s:
        yield Pair(s.fake, s.cached, s.direct, s.session, s.registry, s.cached_health)


def normal(doc: Any) -> Any:
    """A list without its continue token (each path issues its own)."""
    if isinstance(doc, dict) and isinstance(doc.get("metadata"), dict):
        doc = {**doc, "metadata": {k: v for k, v in doc["metadata"].items() if k != "continue"}}
    return doc


WIDGETS = "/apis/example.io/v1alpha1/widgets"
NS1 = "/apis/example.io/v1alpha1/namespaces/ns1/widgets"


@pytest.mark.parametrize(
    ("path", "query"),
    [
        (WIDGETS, {}),
        (WIDGETS, {"resourceVersion": "0"}),
        (NS1, {}),  # a namespace on clusters/*: kcp's 400 on both paths
        (WIDGETS, {"labelSelector": "region=eu"}),
        (WIDGETS, {"labelSelector": "region in (us),env=prod"}),
        (WIDGETS, {"fieldSelector": "metadata.name=w2"}),
        (WIDGETS, {"fieldSelector": "metadata.namespace!=ns1"}),
        (WIDGETS, {"labelSelector": "env=dev"}),  # nothing of the slice matches
    ],
)
async def test_lists_are_equal(pair: Pair, path: str, query: dict[str, str]) -> None:
    (code_c, cached), (code_d, direct) = await pair.both(path, params=query)
    assert (code_c, normal(cached)) == (code_d, normal(direct))


async def test_lists_are_equal_per_cluster_and_as_metadata(pair: Pair) -> None:
    for cluster in CLUSTERS:
        path = NS1
        async with pair.session.get(pair.url(pair.cached, path, cluster=cluster)) as r:
            cached = await r.json()
        async with pair.session.get(pair.url(pair.direct, path, cluster=cluster)) as r:
            direct = await r.json()
        assert normal(cached) == normal(direct)
    (_, cached), (_, direct) = await pair.both(WIDGETS, headers={"Accept": PARTIAL})
    assert cached["kind"] == "PartialObjectMetadataList"
    assert normal(cached) == normal(direct)


async def test_paged_list_walks_the_same_items(pair: Pair) -> None:
    async def walk(base: str) -> list[str]:
        names, token = [], ""
        while True:
            params = {"limit": "2", **({"continue": token} if token else {})}
            async with pair.session.get(pair.url(base, WIDGETS), params=params) as r:
                assert r.status == 200, await r.text()
                doc = await r.json()
            names += [
                f"{i['metadata']['annotations']['kcp.io/cluster']}/{i['metadata']['name']}"
                for i in doc["items"]
            ]
            token = doc["metadata"].get("continue", "")
            if not token:
                return names

    assert await walk(pair.cached) == await walk(pair.direct)


async def events(
    session: aiohttp.ClientSession, url: str, *, count: int, params: dict[str, str]
) -> list[tuple[str, str, str]]:
    """The first ``count`` non-bookmark events of a watch: (type, cluster/name, env label)."""
    out: list[tuple[str, str, str]] = []
    async with asyncio.timeout(WAIT), session.get(url, params={"watch": "1", **params}) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            event = json.loads(line)
            if event["type"] == "BOOKMARK":
                continue
            meta = event["object"]["metadata"]
            cluster = meta.get("annotations", {}).get("kcp.io/cluster", "")
            out.append((event["type"], f"{cluster}/{meta['name']}", meta["labels"].get("env")))
            if len(out) == count:
                return out
    return out


async def test_watches_are_equal_across_relabels_and_deletions(pair: Pair) -> None:
    start = str(pair.fake.resource_version)
    params = {"resourceVersion": start, "allowWatchBookmarks": "true"}
    watches = [
        asyncio.create_task(events(pair.session, pair.url(base, WIDGETS), count=4, params=params))
        for base in (pair.cached, pair.direct)
    ]
    await asyncio.sleep(0.3)  # both watches established (their start rv is fixed anyway)
    obj = pair.fake.get(cluster="c1", namespace="ns1", name="w1")
    assert obj is not None
    obj["metadata"]["labels"]["env"] = "prod"  # enters the slice
    pair.fake.update(cluster="c1", obj=obj)
    obj = pair.fake.get(cluster="c1", namespace="ns1", name="w0")
    assert obj is not None
    obj["metadata"]["labels"]["env"] = "dev"  # leaves the slice
    pair.fake.update(cluster="c1", obj=obj)
    pair.fake.delete(cluster="c2", namespace="ns1", name="w2")  # a visible one goes
    pair.fake.create(cluster="c2", obj=widget("new", env="prod", region="eu"))
    cached, direct = await asyncio.gather(*watches)
    assert cached == direct
    assert cached == [
        ("ADDED", "c1/w1", "prod"),
        ("DELETED", "c1/w0", "prod"),  # the previous, visible content
        ("DELETED", "c2/w2", "prod"),
        ("ADDED", "c2/new", "prod"),
    ]


async def test_watch_from_now_sends_the_state_first(pair: Pair) -> None:
    cached, direct = await asyncio.gather(
        *(
            events(pair.session, pair.url(base, NS1, cluster="c1"), count=2, params={})
            for base in (pair.cached, pair.direct)
        )
    )
    assert (
        sorted(cached) == sorted(direct) == [("ADDED", "c1/w0", "prod"), ("ADDED", "c1/w2", "prod")]
    )


async def test_watch_list_ends_its_initial_events_with_the_bookmark(pair: Pair) -> None:
    params = {
        "watch": "1",
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "allowWatchBookmarks": "true",
    }
    url = pair.url(pair.cached, NS1, cluster="c1")
    seen: list[str] = []
    async with asyncio.timeout(WAIT), pair.session.get(url, params=params) as r:
        async for line in r.content:
            event = json.loads(line)
            annotations = event["object"]["metadata"].get("annotations", {})
            if event["type"] == "BOOKMARK":
                if annotations.get("k8s.io/initial-events-end") == "true":
                    break
                continue
            seen.append(event["object"]["metadata"]["name"])
    assert sorted(seen) == ["w0", "w2"]


async def test_watch_list_from_now_is_served_from_the_cache_when_kcp_moved_on(pair: Pair) -> None:
    """kcp's resourceVersion moves with writes to other resources, which the cache never sees
    (here: APIBindings in other workspaces), so a watch-list from "now" finds the cache
    behind. It is served from the cache's state all the same: kcp's answer could only filter
    by labels, and would show an object leaving the slice as deleted."""
    await pair.both(WIDGETS)  # the cache is synced
    before = pair.fake.resource_version
    for i in range(3):
        pair.fake.bind(cluster=f"elsewhere-{i}")
    assert pair.fake.resource_version > before
    params = {
        "watch": "1",
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "allowWatchBookmarks": "true",
    }
    seen: list[str] = []
    async with asyncio.timeout(WAIT):
        async with pair.session.get(pair.url(pair.cached, NS1, cluster="c1"), params=params) as r:
            async for line in r.content:
                event = json.loads(line)
                annotations = event["object"]["metadata"].get("annotations", {})
                if event["type"] == "BOOKMARK":
                    if annotations.get("k8s.io/initial-events-end") == "true":
                        break
                    continue
                seen.append(event["object"]["metadata"]["name"])
        async with pair.session.get(f"{pair.cached}/metrics") as r:
            text = await r.text()
    assert sorted(seen) == ["w0", "w2"]
    watches = [line for line in text.splitlines() if line.startswith("vwserver_cache_reads")]
    assert not [line for line in watches if "fallback" in line and 'verb="watch"' in line], watches
    assert [line for line in watches if "served" in line and 'verb="watch"' in line], watches


async def test_many_watches_share_one_upstream_watch(pair: Pair) -> None:
    pair.fake.faults.requests.clear()
    url = pair.url(pair.cached, WIDGETS)
    start = str(pair.fake.resource_version)
    clients = [
        asyncio.create_task(events(pair.session, url, count=1, params={"resourceVersion": start}))
        for _ in range(50)
    ]
    await asyncio.sleep(0.5)
    pair.fake.create(cluster="c1", obj=widget("fanout", env="prod", region="eu"))
    results = await asyncio.gather(*clients)
    assert all(r == [("ADDED", "c1/fanout", "prod")] for r in results)
    upstream_watches = [
        r for r in pair.fake.faults.requests if r.query.get("watch") in ("true", "1")
    ]
    assert len(upstream_watches) <= 1  # at most the shared reflector's (re-)watch


async def test_watch_from_before_the_window_is_expired(pair: Pair) -> None:
    """The cache starts its window at its first list; a watch from before it is a 410 in an
    ERROR event, as the apiserver's watch cache answers a resourceVersion it no longer has."""
    await pair.both(WIDGETS)  # the cache listed at the current resourceVersion (> 1)
    url = pair.url(pair.cached, WIDGETS)
    async with pair.session.get(url, params={"watch": "1", "resourceVersion": "1"}) as r:
        assert r.status == 200
        first = json.loads(await r.content.readline())
    assert first["type"] == "ERROR"
    assert first["object"]["code"] == 410
    assert first["object"]["reason"] == "Expired"


async def test_debug_cache_and_metrics_show_the_shared_resource(pair: Pair) -> None:
    await pair.both(WIDGETS)
    async with pair.session.get(f"{pair.cached_health}/debug/cache") as r:
        assert r.status == 200
        (resource,) = (await r.json())["resources"]
    assert resource["objects"] == 10  # every object of the collection, not only the slice's
    assert resource["synced"] is True
    for base in (pair.cached, pair.direct):  # never on the slice listener
        async with pair.session.get(f"{base}/debug/cache") as r:
            assert r.status == 404
    async with pair.session.get(f"{pair.cached}/metrics") as r:
        text = await r.text()
    assert "vwserver_cache_objects{" in text
    # the reads above were the cache's (a fallback would be counted as such)
    assert 'vwserver_cache_reads_total{outcome="served",verb="list"}' in text.replace(
        'verb="list",outcome="served"', 'outcome="served",verb="list"'
    )
    assert 'outcome="fallback"' not in text
    assert "vwserver_cache_freshness_wait_seconds_count 1.0" in text
