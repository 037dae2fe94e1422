"""Upstream work per client request is bounded, against real kcp (issue 22, finding 4).

A slice that records holds asks kcp for its LISTs without its own selector (an object it holds
is in it whatever its labels) and decides membership itself, so kcp's pages can hold nothing
the slice sees. ``?limit=1`` then cost one upstream LIST per object kcp had to skip: with a
thousand objects of another slice before the one that matches, a thousand LISTs. Here the same
collection is read through a slice served by vwserver (with the shared cache, so the slice
records holds; the namespace field selector is a shape the cache leaves to kcp) and kcp's LISTs
are counted by vwserver's own ``vwserver_upstream_requests_total``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import aiohttp
import pytest
import pytest_asyncio

from devenv.bootstrap import Bootstrap, Workspace
from devenv.kcp import KcpInstance
from tests.support.metrics import sample
from tests.support.slices import slice_url, slices_over_kcp
from tests.support.widgets import API, make_namespace, remove_namespace, widget
from vwserver.proxy.lists import MAX_UPSTREAM_PAGES
from vwserver.selector import Selector

OTHERS = 1000  # objects of another slice, before the one that matches (in key order)
CONCURRENCY = 16  # creates in flight at once
PAGE_SIZE = 500  # vwserver's default listPageSize
UPSTREAM = "vwserver_upstream_requests_total"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


@dataclass(frozen=True)
class Crowd:
    ws: Workspace
    namespace: str


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def crowd(kcp: KcpInstance, world: Bootstrap) -> AsyncIterator[Crowd]:
    """A namespace of its own in the first consumer, in key order: ``0-first`` of region ``a``,
    :data:`OTHERS` widgets ``a-0000``… of region ``b``, ``z-match`` of region ``a``; created
    directly through kcp's APIExport virtual workspace, :data:`CONCURRENCY` at a time, and
    removed with the namespace."""
    ws = world.consumers[0]
    namespace = f"amplify-{uuid.uuid4().hex[:6]}"
    await make_namespace(kcp, [ws], namespace)
    try:
        url = f"{world.vw_url}/clusters/{ws.cluster}/{API}/namespaces/{namespace}/widgets"
        gate = asyncio.Semaphore(CONCURRENCY)
        async with kcp.http_session(timeout=60) as session:

            async def create(name: str, region: str) -> None:
                async with (
                    gate,
                    session.post(url, json=widget(name, namespace, {"region": region})) as r,
                ):
                    assert r.status == 201, f"create {name}: {r.status} {await r.text()}"

            await asyncio.gather(
                create("0-first", "a"),
                *(create(f"a-{i:04d}", "b") for i in range(OTHERS)),
                create("z-match", "a"),
            )
        yield Crowd(ws, namespace)
    finally:
        await remove_namespace(kcp, [ws], namespace)


def _names(doc: dict[str, Any]) -> list[str]:
    if doc["kind"] == "Table":
        return [row["object"]["metadata"]["name"] for row in doc["rows"]]
    return [item["metadata"]["name"] for item in doc["items"]]


class _Page(NamedTuple):
    names: list[str]
    cost: float
    """kcp's LISTs for this page (vwserver's own count)."""
    token: str
    """The page's continue token ("" on the last page)."""


def _resumed(query: dict[str, str], token: str) -> dict[str, str]:
    return {**query, "continue": token} if token else query


async def _pages(
    client: aiohttp.ClientSession,
    base: str,
    url: str,
    params: Callable[[str], dict[str, str]],
    *,
    headers: dict[str, str] | None = None,
) -> list[_Page]:
    """Every page of the list at ``url`` through vwserver at ``base`` (``params(token)``: the
    query after the continue token ``token``, "" first), and what each cost kcp."""
    pages: list[_Page] = []
    token = ""
    while True:
        before = await sample(client, base, UPSTREAM, method="GET")
        async with client.get(url, params=params(token), headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            doc = await resp.json()
        token = doc["metadata"].get("continue", "")
        cost = await sample(client, base, UPSTREAM, method="GET") - before
        pages.append(_Page(_names(doc), cost, token))
        if not token:
            return pages


@pytest.mark.parametrize("accept", ["application/json", TABLE], ids=["objects", "table"])
async def test_a_limit_1_list_costs_kcp_a_few_lists(
    kcp: KcpInstance, world: Bootstrap, crowd: Crowd, accept: str
) -> None:
    slices = {"a": Selector.parse("region=a"), "b": Selector.parse("region=b")}
    async with (
        slices_over_kcp(kcp, world, slices=slices, page_size=PAGE_SIZE, cache=True) as base,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client,
    ):
        url = f"{slice_url(base, world, 'a', crowd.ws.cluster)}/{API}/widgets"
        query = {"limit": "1", "fieldSelector": f"metadata.namespace={crowd.namespace}"}
        read = await _pages(
            client, base, url, lambda token: _resumed(query, token), headers={"Accept": accept}
        )
        names = [name for page in read for name in page.names]
        costs = [page.cost for page in read]
        print(f"limit=1 through a slice that records holds: kcp LISTs {costs} for {names}")
        assert names == ["0-first", "z-match"]
        assert max(costs) <= MAX_UPSTREAM_PAGES, costs
        # The second page skips 1000 objects in upstream pages that grow to the page size.
        assert len(costs) == 2 and costs[1] <= 1 + -(-OTHERS // PAGE_SIZE), costs

        # A list of everything is paged upstream with the page size: one LIST per page.
        before = await sample(client, base, UPSTREAM, method="GET")
        async with client.get(url, params={"fieldSelector": query["fieldSelector"]}) as resp:
            assert resp.status == 200, await resp.text()
            doc = await resp.json()
        assert _names(doc) == ["0-first", "z-match"]
        cost = await sample(client, base, UPSTREAM, method="GET") - before
        assert cost == -(-(OTHERS + 2) // PAGE_SIZE), cost

        # The other slice pages through its thousand objects, none lost or repeated. Its
        # first page: kcp's first page (5 objects) holds 4 it sees, the next one (the page
        # size) 500, of which one fills the client's page — the proxy's continue token must
        # resume right after that one.
        other = f"{slice_url(base, world, 'b', crowd.ws.cluster)}/{API}/widgets"
        fields = {"fieldSelector": query["fieldSelector"]}
        read = await _pages(
            client,
            base,
            other,
            lambda token: _resumed({"limit": "400" if token else "5", **fields}, token),
            headers={"Accept": accept},
        )
        seen = [name for page in read for name in page.names]
        costs = [page.cost for page in read]
        print(f"limit=5, then 400 through the other slice: kcp LISTs {costs}")
        assert seen == [f"a-{i:04d}" for i in range(OTHERS)]
        # the first page: kcp's page of 5, the page of 500 it filled up in, and that page's
        # first object read again (for kcp's continue token after it)
        assert costs[0] == 3 and max(costs) <= MAX_UPSTREAM_PAGES, costs


async def test_a_short_page_ends_on_its_own_last_object(
    kcp: KcpInstance, world: Bootstrap, crowd: Crowd
) -> None:
    """With a small page size the rounds run out before ``z-match``: the first page is short
    (``0-first``), and its continue token follows ``0-first`` — kcp's first page read again
    up to there at its resourceVersion — never one of the objects of the other slice the proxy
    read past (a token names the object it follows). The next page reads on to ``z-match``,
    one LIST per page size of objects it does not see."""
    page_size = 100
    slices = {"a": Selector.parse("region=a")}
    async with (
        slices_over_kcp(kcp, world, slices=slices, page_size=page_size, cache=True) as base,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client,
    ):
        url = f"{slice_url(base, world, 'a', crowd.ws.cluster)}/{API}/widgets"
        query = {"limit": "2", "fieldSelector": f"metadata.namespace={crowd.namespace}"}
        pages = await _pages(client, base, url, lambda token: _resumed(query, token))
        print(f"limit=2, page size {page_size}: {[(names, cost) for names, cost, _ in pages]}")
        assert [names for names, _, _ in pages] == [["0-first"], ["z-match"]], pages
        first_token = pages[0][2]
        start = json.loads(base64.urlsafe_b64decode(first_token + "=" * (-len(first_token) % 4)))
        assert start["start"].rstrip("\0").rsplit("/", 1)[-1] == "0-first", start
        assert pages[0][1] == MAX_UPSTREAM_PAGES, pages  # 2 + 100 + 100 objects, the re-read
        assert pages[1][1] <= MAX_UPSTREAM_PAGES + -(-OTHERS // page_size), pages
