"""Upstream work per client request is bounded, against real kcp (issues 22 and 23).

A slice that records holds once asked kcp for its LISTs without its own selector (an object it
holds is in it whatever its labels), so kcp's pages could hold nothing the slice sees: first
``?limit=1`` cost one upstream LIST per object kcp had to skip, then one per ``listPageSize`` of
them. Now kcp is asked twice, each time naming the slice (its selector; its holder label), so
the objects of other slices cost nothing. Here the same collection is read through slices
served by vwserver (with the shared cache, so they record holds; the namespace field selector
is a shape the cache leaves to kcp); kcp's LISTs are counted by vwserver's own
``vwserver_upstream_requests_total``, and every one's ``labelSelector`` is checked
(:func:`tests.security.support.unselected_lists`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import aiohttp
import pytest
import pytest_asyncio

from devenv.bootstrap import Bootstrap, Workspace
from devenv.kcp import KcpInstance
from tests.security.support import unselected_lists
from tests.support.metrics import sample
from tests.support.slices import slice_url, slices_over_kcp
from tests.support.upstream_record import RecordingUpstream
from tests.support.widgets import API, make_namespace, remove_namespace, widget
from vwserver.holds import holder_label, slice_id
from vwserver.proxy.lists import decode_continue
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


def _checked(world: Bootstrap, proxy: RecordingUpstream, name: str, selector: Selector) -> None:
    """Every LIST ``proxy`` sent named slice ``name`` (its selector or its holder label)."""
    lists = proxy.lists("widgets")
    holder = holder_label(slice_id(world.provider.cluster, name))
    assert lists and not unselected_lists(lists, slice_selector=selector, holder=holder), lists
    proxy.sent.clear()


@pytest.mark.parametrize("accept", ["application/json", TABLE], ids=["objects", "table"])
async def test_a_limit_1_list_costs_kcp_two_lists(
    kcp: KcpInstance, world: Bootstrap, crowd: Crowd, accept: str
) -> None:
    slices = {"a": Selector.parse("region=a"), "b": Selector.parse("region=b")}
    made: list[RecordingUpstream] = []

    def upstream(**kw: Any) -> RecordingUpstream:
        made.append(RecordingUpstream(**kw))
        return made[-1]

    async with (
        slices_over_kcp(
            kcp, world, slices=slices, page_size=PAGE_SIZE, cache=True, upstream=upstream
        ) as base,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client,
    ):
        (proxy,) = made
        url = f"{slice_url(base, world, 'a', crowd.ws.cluster)}/{API}/widgets"
        query = {"limit": "1", "fieldSelector": f"metadata.namespace={crowd.namespace}"}
        read = await _pages(
            client, base, url, lambda token: _resumed(query, token), headers={"Accept": accept}
        )
        names = [name for page in read for name in page.names]
        costs = [page.cost for page in read]
        print(f"limit=1 through a slice that records holds: kcp LISTs {costs} for {names}")
        assert names == ["0-first", "z-match"]
        # the first page: the selected and the held list (empty: its token says so); the
        # second: the selected list alone, from the first page's token — the thousand objects
        # of the other slice between them cost nothing
        assert costs == [2, 1], costs
        assert decode_continue(read[0].token).streams == ("selected",)
        _checked(world, proxy, "a", slices["a"])

        # A list of everything: each list paged with the page size, here one page each.
        before = await sample(client, base, UPSTREAM, method="GET")
        async with client.get(url, params={"fieldSelector": query["fieldSelector"]}) as resp:
            assert resp.status == 200, await resp.text()
            doc = await resp.json()
        assert _names(doc) == ["0-first", "z-match"]
        cost = await sample(client, base, UPSTREAM, method="GET") - before
        assert cost == 2, cost
        _checked(world, proxy, "a", slices["a"])

        # The other slice pages through its thousand objects, none lost or repeated, one LIST
        # per page after the first.
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
        assert costs == [2, 1, 1, 1], costs
        _checked(world, proxy, "b", slices["b"])
