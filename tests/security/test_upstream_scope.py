"""Defence in depth on what the upstream sends back: nothing outside the request's own scope is
forwarded, whatever the upstream answers (``vwserver.proxy.filtering.Scope``).

The fake upstream's ``ignore_scope`` fault plays a shard mix-up: reads of one logical cluster
are answered with objects of every cluster and namespace, a GET with another object than the one
named. Every object is in the slice (``env=prod``), so only the scope check can keep the foreign
ones out. Every read path — kcp-answered LIST (plain, Table, PartialObjectMetadataList, YAML, a
client's own paging), GET in every shape, WATCH (plain, Table, the deprecated ``/watch/`` paths,
a ``metadata.name`` field selector), and the shared cache's LIST and WATCH (which stores the
wildcard watch's objects keyed by their cluster) — must answer only objects of the URL's cluster,
namespace and name; a GET answers 404 as for a missing object; the proxy counts what it dropped.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from fakekcp.upstream import FakeUpstream
from tests.integration.conftest import CLUSTERS, PROXY_TOKEN, SLICE_CLUSTER, routes_for, widget
from tests.support.cache import CachedAndDirect, cached_and_direct

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
POM = "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"
POM_LIST = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"
YAML = "application/yaml"
NAMESPACES = ("ns1", "ns2")
API = "/apis/example.io/v1alpha1"


def name_of(cluster: str, ns: str, i: int) -> str:
    return f"{cluster}-{ns}-w{i}"


def seed(fake: FakeUpstream) -> None:
    for cluster in CLUSTERS:
        for ns in NAMESPACES:
            for i in range(3):
                fake.create(cluster=cluster, obj=widget(name_of(cluster, ns, i), ns=ns, env="prod"))


@pytest.fixture
async def pair() -> AsyncIterator[CachedAndDirect]:
    async with cached_and_direct(
        FakeUpstream(bookmark_interval=0.2), routes=routes_for, token=PROXY_TOKEN, seed=seed
    ) as pair:
        yield pair


def url(base: str, path: str, *, cluster: str = "c1") -> str:
    return f"{base}/services/filtered-apiexport/{SLICE_CLUSTER}/prod/clusters/{cluster}{path}"


ALL_NAMES = {name_of(c, ns, i) for c in CLUSTERS for ns in NAMESPACES for i in range(3)}


def names_in(text: str) -> set[str]:
    return {n for n in ALL_NAMES if n in text}


def in_scope(*, ns: str = "ns1", name: str = "") -> set[str]:
    return {n for n in ALL_NAMES if n.startswith(f"c1-{ns}-") and (not name or n == name)}


async def read(session: aiohttp.ClientSession, target: str, **kwargs: Any) -> tuple[int, str]:
    async with session.get(target, **kwargs) as r:
        return r.status, await r.text()


async def out_of_scope_count(session: aiohttp.ClientSession, base: str) -> float:
    async with session.get(f"{base}/metrics") as r:
        text = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vwserver_upstream_out_of_scope_total{")
    )


LISTS = [
    ("plain", None, {}),
    ("paged", None, {"limit": "4"}),  # the fourth object is in ns2
    ("table", TABLE, {}),
    ("table-no-object", TABLE, {"includeObject": "None"}),
    ("pom-list", POM_LIST, {}),
    ("yaml", YAML, {}),
    ("field-selector", None, {"fieldSelector": "metadata.namespace=ns1"}),
]


@pytest.mark.parametrize(
    ("accept", "query"), [(a, q) for _, a, q in LISTS], ids=[i for i, *_ in LISTS]
)
async def test_lists_forward_only_objects_in_scope(
    pair: CachedAndDirect, accept: str | None, query: dict[str, str]
) -> None:
    pair.fake.faults.ignore_scope = True
    headers = {"Accept": accept} if accept else {}
    for base in (pair.direct, pair.cached):
        status, text = await read(
            pair.session, url(base, f"{API}/namespaces/ns1/widgets"), params=query, headers=headers
        )
        assert status == 200, text
        shown = names_in(text)
        assert shown, text
        assert shown <= in_scope(), f"{base}: foreign objects {sorted(shown - in_scope())}"
    assert await out_of_scope_count(pair.session, pair.direct) > 0


async def test_a_named_field_selector_list_forwards_only_that_name(pair: CachedAndDirect) -> None:
    pair.fake.faults.ignore_scope = True
    wanted = name_of("c1", "ns1", 1)
    for base in (pair.direct, pair.cached):
        status, text = await read(
            pair.session,
            url(base, f"{API}/namespaces/ns1/widgets"),
            params={"fieldSelector": f"metadata.name={wanted}"},
        )
        assert status == 200, text
        assert names_in(text) == {wanted}, text


async def test_a_cluster_wide_cached_list_is_one_cluster(pair: CachedAndDirect) -> None:
    """The cache holds every cluster's objects (from the wildcard watch): a per-cluster URL
    gets that cluster's only."""
    for cluster in CLUSTERS:
        status, text = await read(pair.session, url(pair.cached, f"{API}/widgets", cluster=cluster))
        assert status == 200, text
        assert names_in(text) == {n for n in ALL_NAMES if n.startswith(f"{cluster}-")}


@pytest.mark.parametrize("accept", [None, TABLE, POM, YAML], ids=["object", "table", "pom", "yaml"])
async def test_get_of_another_object_answers_like_missing(
    pair: CachedAndDirect, accept: str | None
) -> None:
    headers = {"Accept": accept} if accept else {}
    target = url(pair.direct, f"{API}/namespaces/ns1/widgets/{name_of('c1', 'ns1', 0)}")
    missing = url(pair.direct, f"{API}/namespaces/ns1/widgets/nothing-here")
    status, text = await read(pair.session, target, headers=headers)
    assert status == 200 and names_in(text) == {name_of("c1", "ns1", 0)}, text
    pair.fake.faults.ignore_scope = True
    status, text = await read(pair.session, target, headers=headers)
    _, missing_text = await read(pair.session, missing, headers=headers)
    assert status == 404, text
    assert not names_in(text.replace(name_of("c1", "ns1", 0), "")), text
    assert text.replace(name_of("c1", "ns1", 0), "X") == missing_text.replace("nothing-here", "X")
    assert await out_of_scope_count(pair.session, pair.direct) > 0


WATCHES = [
    ("plain", f"{API}/namespaces/ns1/widgets", None, {}, ""),
    ("table", f"{API}/namespaces/ns1/widgets", TABLE, {}, ""),
    ("legacy", f"{API}/watch/namespaces/ns1/widgets", None, {}, ""),
    (
        "legacy-named",
        f"{API}/watch/namespaces/ns1/widgets/{name_of('c1', 'ns1', 2)}",
        None,
        {},
        name_of("c1", "ns1", 2),
    ),
    (
        "field-selector-name",
        f"{API}/namespaces/ns1/widgets",
        None,
        {"fieldSelector": f"metadata.name={name_of('c1', 'ns1', 2)}"},
        name_of("c1", "ns1", 2),
    ),
    (
        "field-selector-namespace",
        f"{API}/widgets",
        None,
        {"fieldSelector": "metadata.namespace=ns1"},
        "",
    ),
]


@pytest.mark.parametrize(
    ("path", "accept", "query", "name"),
    [(p, a, q, n) for _, p, a, q, n in WATCHES],
    ids=[i for i, *_ in WATCHES],
)
async def test_watches_forward_only_events_in_scope(
    pair: CachedAndDirect, path: str, accept: str | None, query: dict[str, str], name: str
) -> None:
    """A watch with its initial state (no resourceVersion) and a change of every object."""
    pair.fake.faults.ignore_scope = True
    headers = {"Accept": accept} if accept else {}
    params = {**query, "watch": "true", "timeoutSeconds": "1"}
    for base in (pair.direct, pair.cached):
        status, text = await read(pair.session, url(base, path), params=params, headers=headers)
        assert status == 200, text
        events = [json.loads(line) for line in text.splitlines() if line.strip()]
        assert all(e["type"] != "ERROR" for e in events), text
        shown = names_in(text)
        assert shown, f"{base}: {text}"
        assert shown <= in_scope(name=name), f"{base}: foreign {sorted(shown - in_scope())}"
    assert await out_of_scope_count(pair.session, pair.direct) > 0
