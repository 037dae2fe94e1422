"""Tables (``kubectl get``, ``kubectl get -w``) from the shared watch cache answer what the
pass-through path answers.

Two vwservers in front of one fake upstream, as in test_cache_reads.py: one serves LIST and
WATCH from the cache, the other passes them to the upstream. Widgets have printer columns of
every kind (an integer, a string, a date: kcp's cells); every Table read goes to both, and the
answers must be equal once the ages are normalised (each path prints them when it answers —
which is the point: a cached row must not show the age it had when it was cached, checked with
a clock that runs ahead). Then what only the cache does: one upstream Table watch for every
client, rows sharing the object cache's bytes, and the fallback to kcp for a date column whose
source it cannot know.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import aiohttp
import pytest

from fakekcp.store import PrinterColumn, ResourceSpec
from fakekcp.upstream import FakeUpstream
from tests.integration.conftest import CLUSTERS, PROXY_TOKEN, SLICE_CLUSTER, routes_for, widget
from tests.support.cache import CachedAndDirect, cache_reads, cached_and_direct, until_counted
from vwserver.cache.table_resource import SharedTable
from vwserver.clock import SystemClock

WAIT = 10.0
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
TABLE_BETA = "application/json;as=Table;v=v1beta1;g=meta.k8s.io"
KUBECTL = f"{TABLE},{TABLE_BETA},application/json"
WIDGETS = "/apis/example.io/v1alpha1/widgets"
NS1 = "/apis/example.io/v1alpha1/namespaces/ns1/widgets"
GADGETS = "/apis/example.io/v1alpha1/gadgets"

WIDGET_SPEC = ResourceSpec(
    printer_columns=(
        PrinterColumn("Size", "integer", ".spec.size"),
        PrinterColumn("Secret", "string", ".spec.secret", priority=1),
        PrinterColumn("Age", "date", ".metadata.creationTimestamp"),
        PrinterColumn("Gone", "date", ".status.gone"),  # absent: a null cell
    )
)
# A date column described by its author: the cache cannot know what it shows the age of.
GADGET_SPEC = ResourceSpec(
    plural="gadgets",
    kind="Gadget",
    printer_columns=(
        PrinterColumn("Built", "date", ".metadata.creationTimestamp", description="When built"),
    ),
)


class AheadClock(SystemClock):
    """The system clock, ``ahead`` later: what a cached row's age must follow."""

    def __init__(self) -> None:
        self.ahead = timedelta(0)

    def now(self) -> datetime:
        return super().now() + self.ahead


@dataclass
class Pair:
    served: CachedAndDirect
    clock: AheadClock

    @property
    def fake(self) -> FakeUpstream:
        return self.served.fake

    @property
    def cached(self) -> str:
        return self.served.cached

    @property
    def direct(self) -> str:
        return self.served.direct

    @property
    def session(self) -> aiohttp.ClientSession:
        return self.served.session

    def url(self, base: str, path: str, *, cluster: str = "*") -> str:
        return f"{base}/services/filtered-apiexport/{SLICE_CLUSTER}/prod/clusters/{cluster}{path}"

    async def get(self, base: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        cluster = kwargs.pop("cluster", "*")
        async with self.session.get(self.url(base, path, cluster=cluster), **kwargs) as r:
            return r.status, json.loads(await r.read())

    async def both(self, path: str, **kwargs: Any) -> tuple[tuple[int, Any], tuple[int, Any]]:
        return await self.get(self.cached, path, **kwargs), await self.get(
            self.direct, path, **kwargs
        )

    async def reads(self, verb: str, outcome: str) -> float:
        return await cache_reads(self.session, self.cached, verb=verb, outcome=outcome)

    async def counted(self, verb: str, outcome: str, count: float) -> None:
        await until_counted(self.session, self.cached, verb=verb, outcome=outcome, count=count)


def seed(fake: FakeUpstream) -> None:
    for cluster in CLUSTERS:
        for i, (env_, region) in enumerate(
            [("prod", "eu"), ("dev", "eu"), ("prod", "us"), ("dev", "us"), ("prod", "eu")]
        ):
            obj = widget(f"w{i}", ns="ns1" if i < 3 else "ns2", env=env_, region=region)
            obj["spec"]["size"] = i
            fake.create(cluster=cluster, obj=obj)
        gadget = {**widget("g0", env="prod"), "kind": "Gadget"}
        fake.create(cluster=cluster, obj=gadget)


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    clock = AheadClock()
    upstream = FakeUpstream(
        resources=[WIDGET_SPEC, GADGET_SPEC], bookmark_interval=0.2, history_size=50
    )
    async with cached_and_direct(
        upstream, routes=routes_for, token=PROXY_TOKEN, seed=seed, clock=clock, within=WAIT
    ) as served:
        yield Pair(served, clock)


_AGE = re.compile(r"^(\d+[smhdy])+$")


def normal(doc: Any) -> Any:
    """Ages printed as ``<age>`` (each path prints them when it answers) and a list's continue
    token dropped (each path issues its own)."""
    if isinstance(doc, dict):
        return {
            k: normal(v) if not (k == "metadata" and "continue" in v) else _without_continue(v)
            for k, v in doc.items()
        }
    if isinstance(doc, list):
        return [normal(v) for v in doc]
    if isinstance(doc, str) and _AGE.match(doc):
        return "<age>"
    return doc


def _without_continue(meta: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in meta.items() if k != "continue"}


def names(table: dict[str, Any]) -> list[str]:
    return [row["cells"][0] for row in table["rows"]]


# --- LIST -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept", "query"),
    [
        (TABLE, {}),
        (TABLE_BETA, {}),
        (KUBECTL, {"limit": "500"}),  # what kubectl get sends
        (TABLE, {"includeObject": "None"}),
        (TABLE, {"includeObject": "Metadata"}),
        (TABLE, {"includeObject": "Object"}),
        (TABLE_BETA, {"includeObject": "Object"}),
        (TABLE, {"resourceVersion": "0"}),
        (TABLE, {"resourceVersion": "0", "limit": "2"}),  # the watch cache ignores the limit
        (TABLE, {"labelSelector": "region=eu"}),
        (TABLE, {"fieldSelector": "metadata.name=w2"}),
        (TABLE, {"labelSelector": "env=dev"}),  # nothing of the slice matches
    ],
)
async def test_table_lists_are_equal(pair: Pair, accept: str, query: dict[str, str]) -> None:
    served = await pair.reads("list", "served")
    (code_c, cached), (code_d, direct) = await pair.both(
        WIDGETS, params=query, headers={"Accept": accept}
    )
    assert (code_c, normal(cached)) == (code_d, normal(direct))
    assert cached["kind"] == "Table"
    await pair.counted("list", "served", served + 1)  # from the cache, not kcp


async def test_table_list_of_one_cluster_and_namespace(pair: Pair) -> None:
    for cluster in CLUSTERS:
        (_, cached), (_, direct) = await pair.both(
            NS1, cluster=cluster, headers={"Accept": KUBECTL}
        )
        assert normal(cached) == normal(direct)
        assert names(cached) == ["w0", "w2"]


async def test_paged_table_list_walks_the_same_rows(pair: Pair) -> None:
    async def walk(base: str) -> list[Any]:
        rows: list[Any] = []
        token = ""
        while True:
            params = {"limit": "2", **({"continue": token} if token else {})}
            _, doc = await pair.get(base, WIDGETS, params=params, headers={"Accept": TABLE})
            assert doc["columnDefinitions"], doc  # on every page
            rows += normal(doc["rows"])
            token = doc["metadata"].get("continue", "")
            if not token:
                return rows

    cached, direct = await walk(pair.cached), await walk(pair.direct)
    assert cached == direct
    assert len(cached) == 6


async def test_ages_are_printed_when_the_table_is_served(pair: Pair) -> None:
    """kcp printed every row's Age when the cache received it; the cache prints it anew for
    every answer (a cached row that kept kcp's cell would still say a few seconds)."""
    _, table = await pair.get(pair.cached, WIDGETS, headers={"Accept": TABLE})
    columns = [c["name"] for c in table["columnDefinitions"]]
    age, gone = columns.index("Age"), columns.index("Gone")
    assert all(re.fullmatch(r"\d+s", row["cells"][age]) for row in table["rows"])
    assert all(row["cells"][gone] is None for row in table["rows"])
    pair.clock.ahead = timedelta(hours=3, minutes=7)
    _, later = await pair.get(pair.cached, WIDGETS, headers={"Accept": TABLE})
    assert {row["cells"][age] for row in later["rows"]} == {"3h7m"}
    assert [row["cells"][:age] for row in later["rows"]] == [
        row["cells"][:age] for row in table["rows"]
    ]


async def test_a_date_column_of_unknown_source_is_printed_by_kcp(pair: Pair) -> None:
    fallback = await pair.reads("list", "fallback")
    (code_c, cached), (code_d, direct) = await pair.both(GADGETS, headers={"Accept": TABLE})
    assert (code_c, normal(cached)) == (code_d, normal(direct))
    assert names(cached) == ["g0", "g0"]
    await pair.counted("list", "fallback", fallback + 1)
    # the same collection's objects still come from the cache
    served = await pair.reads("list", "served")
    (_, plain), _ = await pair.both(GADGETS)
    assert plain["kind"] == "GadgetList"
    await pair.counted("list", "served", served + 1)


# --- WATCH ------------------------------------------------------------------------------------


async def events(
    pair: Pair, base: str, *, count: int, params: dict[str, str], accept: str = TABLE
) -> list[dict[str, Any]]:
    """The first ``count`` events of a Table watch that are not periodic bookmarks."""
    out: list[dict[str, Any]] = []
    url = pair.url(base, WIDGETS)
    headers = {"Accept": accept}
    async with (
        asyncio.timeout(WAIT),
        pair.session.get(url, params={"watch": "1", **params}, headers=headers) as r,
    ):
        assert r.status == 200, await r.text()
        async for line in r.content:
            event = json.loads(line)
            if event["type"] == "BOOKMARK" and "initial-events-end" not in line.decode():
                continue
            out.append(normal(event))
            if len(out) == count:
                return out
    return out


def _relabel(pair: Pair, cluster: str, name: str, env: str) -> None:
    obj = pair.fake.get(cluster=cluster, namespace="ns1", name=name)
    assert obj is not None
    obj["metadata"]["labels"]["env"] = env
    pair.fake.update(cluster=cluster, obj=obj)


@pytest.mark.parametrize("include", ["", "None", "Metadata", "Object"])
async def test_table_watches_are_equal_across_relabels_and_deletions(
    pair: Pair, include: str
) -> None:
    params = {"resourceVersion": str(pair.fake.resource_version)}
    if include:
        params["includeObject"] = include
    await pair.both(WIDGETS, headers={"Accept": TABLE})  # the Table cache has listed
    served = await pair.reads("watch", "served")
    watches = [
        asyncio.create_task(events(pair, base, count=5, params=params))
        for base in (pair.cached, pair.direct)
    ]
    await asyncio.sleep(0.3)  # both watches established (their start rv is fixed anyway)
    _relabel(pair, "c1", "w1", "prod")  # enters the slice
    _relabel(pair, "c1", "w0", "dev")  # leaves it: DELETED with the previous row
    obj = pair.fake.get(cluster="c2", namespace="ns1", name="w2")
    assert obj is not None
    obj["spec"]["size"] = 42
    pair.fake.update(cluster="c2", obj=obj)
    pair.fake.delete(cluster="c2", namespace="ns1", name="w2")
    pair.fake.create(cluster="c2", obj=widget("new", env="prod", region="eu"))
    cached, direct = await asyncio.gather(*watches)
    assert cached == direct
    assert [(e["type"], e["object"]["rows"][0]["cells"][:2]) for e in cached] == [
        ("ADDED", ["w1", 1]),
        ("DELETED", ["w0", 0]),
        ("MODIFIED", ["w2", 42]),
        ("DELETED", ["w2", 42]),
        ("ADDED", ["new", 1]),
    ]
    definitions = [e["object"]["columnDefinitions"] for e in cached]
    assert definitions[0] and definitions[1:] == [None] * 4  # only the first event has them
    await pair.counted("watch", "served", served + 1)


@pytest.mark.parametrize("include", ["Metadata", "None", "Object"])
async def test_table_watch_list_ends_its_initial_rows_with_a_table_bookmark(
    pair: Pair, include: str
) -> None:
    params = {
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "allowWatchBookmarks": "true",
        "includeObject": include,
    }
    served = await pair.reads("watch", "served")
    cached, direct = await asyncio.gather(
        *(events(pair, base, count=7, params=params) for base in (pair.cached, pair.direct))
    )
    await pair.counted("watch", "served", served + 1)
    # the initial rows, then the bookmark (its resourceVersion is each path's own)
    for stream in (cached, direct):
        stream[-1]["object"]["metadata"].pop("resourceVersion")
        marker = stream[-1]["object"]["rows"][0]["object"]
        if marker is not None:
            marker["metadata"].pop("resourceVersion")
    assert cached == direct
    assert [e["type"] for e in cached] == ["ADDED"] * 6 + ["BOOKMARK"]
    assert cached[-1]["object"]["rows"][0]["cells"] == ["", None, None, None, None]


async def test_one_upstream_table_watch_serves_every_table_watch(pair: Pair) -> None:
    pair.fake.faults.requests.clear()
    start = str(pair.fake.resource_version)
    clients = [
        asyncio.create_task(events(pair, pair.cached, count=1, params={"resourceVersion": start}))
        for _ in range(20)
    ]
    await asyncio.sleep(0.5)
    pair.fake.create(cluster="c1", obj=widget("fanout", env="prod", region="eu"))
    results = await asyncio.gather(*clients)
    assert {json.dumps(r) for r in results} == {json.dumps(results[0])}
    assert results[0][0]["object"]["rows"][0]["cells"][0] == "fanout"
    watches = [r for r in pair.fake.faults.requests if r.query.get("watch") in ("true", "1")]
    assert len(watches) <= 1  # the Table resource's own (re-)watch
    assert all(r.query.get("includeObject") == "Object" for r in watches)


async def test_a_table_watch_from_before_the_window_is_expired(pair: Pair) -> None:
    await pair.both(WIDGETS, headers={"Accept": TABLE})
    url = pair.url(pair.cached, WIDGETS)
    params = {"watch": "1", "resourceVersion": "1"}
    async with pair.session.get(url, params=params, headers={"Accept": TABLE}) as r:
        assert r.status == 200
        first = json.loads(await r.content.readline())
    assert (first["type"], first["object"]["kind"]) == ("ERROR", "Status")
    assert (first["object"]["code"], first["object"]["reason"]) == (410, "Expired")


# --- the Table resource -------------------------------------------------------------------------


async def test_rows_share_the_object_caches_bytes(pair: Pair) -> None:
    await pair.both(WIDGETS)  # the object cache first
    await pair.both(WIDGETS, headers={"Accept": TABLE})
    resources = {r.table: r for r in pair.served.registry.resources() if r.api_path == WIDGETS}
    table, objects = resources[True], resources[False]
    assert isinstance(table, SharedTable)
    rows, entries = table.store.snapshot(), objects.store.snapshot()
    assert [r.key for r in rows] == [e.key for e in entries]
    assert all(r.raw is e.raw and r.meta is e.meta for r, e in zip(rows, entries, strict=True))
    async with pair.session.get(f"{pair.served.cached_health}/debug/cache") as r:
        stats = (await r.json())["resources"]
    assert {s.get("representation", "object") for s in stats} == {"object", "Table"}
    assert len({(s["path"], s["shard"]) for s in stats}) == len(stats)  # each its own name
