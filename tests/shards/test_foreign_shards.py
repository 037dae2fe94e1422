"""Requests through one shard's endpoint that name what only another shard has (issue #24
points 2 and 3): a consumer cluster that lives on the other shard, and a resourceVersion the
other shard issued. vwserver gives kcp's own answer or a Status — never another shard's objects,
never a hang or a silently skipped stretch of changes.

kcp v0.32.3 facts checked here against kcp's own VW of each shard: a logical cluster without an
APIBinding on that shard is 403 Forbidden for LIST, WATCH and writes, like a cluster that does
not exist; ``clusters/*`` is 200 with the shard's own objects.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest_asyncio

from devenv.bootstrap import SAMPLE_NAMESPACES
from devenv.shards import ROOT_SHARD, SECOND_SHARD
from tests.e2e.controller_env import Served, unique
from tests.shards.conftest import ShardedWorld
from tests.shards.test_slices_shards import call, prod_endpoints, served, widgets

__all__ = ["served"]  # the module fixture of test_slices_shards, one vwserver per module

# A well-formed logical-cluster name that no workspace has.
NOWHERE = "zz0nowhere0zz"
YAML = "application/yaml"


@pytest_asyncio.fixture(loop_scope="session")
async def session(sharded_world: ShardedWorld) -> AsyncIterator[aiohttp.ClientSession]:
    async with sharded_world.bed.front.http_session(timeout=30) as s:
        yield s


async def answer(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    body: Any = None,
    accept: str | None = None,
) -> tuple[int, Any]:
    """The status and decoded body (JSON, else the text) of one request."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if accept:
        headers["Accept"] = accept
    data = None if body is None else json.dumps(body)
    async with session.request(method, url, data=data, headers=headers) as resp:
        text = await resp.text()
    try:
        return resp.status, json.loads(text.splitlines()[0]) if text else None
    except (ValueError, IndexError):
        return resp.status, text


def widget(w: ShardedWorld, name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{w.world.group}/{w.world.version}",
        "kind": "Widget",
        "metadata": {"name": name, "labels": {"env": "prod"}},
        "spec": {"size": 1, "color": "blue"},
    }


async def test_a_cluster_the_shard_does_not_serve_gets_kcps_answer_for_every_verb(
    sharded_world: ShardedWorld, served: Served, session: aiohttp.ClientSession
) -> None:
    """Through each shard's endpoint, the other shard's consumer and a cluster that does not
    exist: LIST (from the cache), WATCH (from the cache), a Table LIST, GET and CREATE answer
    what kcp's VW of that shard answers (403) — the cache serves nothing for them — while
    ``clusters/*`` shows that shard's consumer only."""
    w = sharded_world
    endpoints = await prod_endpoints(w, served)
    ns = SAMPLE_NAMESPACES[0]
    for shard, url in endpoints.items():
        (elsewhere,) = (c for c in w.world.consumers if c is not w.consumer_on(shard))
        for cluster in (elsewhere.cluster, NOWHERE):
            requests: list[tuple[str, str, dict[str, Any]]] = [
                ("LIST", widgets(w, "{}", cluster), {}),
                ("LIST-ns", widgets(w, "{}", cluster, ns), {}),
                (
                    "LIST-table",
                    widgets(w, "{}", cluster),
                    {"accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
                ),
                ("WATCH", widgets(w, "{}", cluster) + "?watch=1&timeoutSeconds=2", {}),
                ("GET", widgets(w, "{}", cluster, ns) + "/prod-eu", {}),
                ("CREATE", widgets(w, "{}", cluster, ns), {"body": widget(w, unique("no"))}),
            ]
            for what, template, kw in requests:
                method = "POST" if what == "CREATE" else "GET"
                kcp_code, _ = await answer(session, method, template.format(w.vw_url(shard)), **kw)
                code, ours = await answer(session, method, template.format(url), **kw)
                where = f"{shard}: {what} of {cluster}"
                assert kcp_code == 403, where
                assert code == kcp_code, (where, ours)
                assert (ours["kind"], ours["reason"]) == ("Status", "Forbidden"), (where, ours)
        code, everything = await call(session, "GET", widgets(w, url, "*"))
        assert code == 200, everything
        clusters = {i["metadata"]["annotations"]["kcp.io/cluster"] for i in everything["items"]}
        # Other modules add workspaces on each shard (see test_slices_shards): the shard's own
        # consumer is there, the other shard's never.
        assert w.consumer_on(shard).cluster in clusters, clusters
        assert not clusters & w.clusters_not_on(shard), clusters


async def _rv(session: aiohttp.ClientSession, url: str) -> int:
    code, body = await call(session, "GET", url)
    assert code == 200, body
    return int(body["metadata"]["resourceVersion"])


async def test_a_resource_version_of_the_other_shard_is_410_or_this_shards_never_the_others(
    sharded_world: ShardedWorld, served: Served, session: aiohttp.ClientSession
) -> None:
    """Issue #24 point 3: a bare resourceVersion from one shard's endpoint used on the other's.
    One newer than the target shard has (each shard's etcd counts on its own; the root shard,
    busier, is ahead: the test writes there until it is) is a 410 Expired Status for LIST with
    ``NotOlderThan`` or ``Exact``, a WATCH from it, and a YAML LIST (kcp answers those: the
    pass-through path checks too) — at once, where kcp's VW waits for a revision it has not
    reached. One older than the target's is a revision of the target shard: its answer shows
    only the target shard's objects (or is 410 when that revision left the window)."""
    w = sharded_world
    endpoints = await prod_endpoints(w, served)
    root, second = endpoints[ROOT_SHARD], endpoints[SECOND_SHARD]
    mine = w.consumer_on(ROOT_SHARD)
    for _ in range(50):
        ahead = await _rv(session, widgets(w, root, "*"))
        if ahead > await _rv(session, widgets(w, w.vw_url(SECOND_SHARD), "*") + "?limit=1") + 20:
            break
        code, _ = await call(
            session,
            "POST",
            widgets(w, root, mine.cluster, SAMPLE_NAMESPACES[0]),
            widget(w, unique("rv")),
        )
        assert code == 201
    else:
        raise AssertionError("the root shard's resourceVersion never got ahead of the second's")
    base = widgets(w, second, "*")
    for query, accept in (
        (f"?resourceVersion={ahead}&resourceVersionMatch=NotOlderThan", None),
        (f"?resourceVersion={ahead}&resourceVersionMatch=Exact", None),
        (f"?resourceVersion={ahead}&limit=1", None),
        (f"?watch=1&resourceVersion={ahead}&timeoutSeconds=5", None),
        (f"?watch=1&resourceVersion={ahead}&allowWatchBookmarks=true&timeoutSeconds=5", None),
        (f"?resourceVersion={ahead}&resourceVersionMatch=NotOlderThan", YAML),
    ):
        code, body = await answer(session, "GET", base + query, accept=accept)
        assert code == 410, (query, accept, body)
        if accept is None:
            assert (body["kind"], body["reason"]) == ("Status", "Expired"), body
            assert "per shard" in body["message"]

    behind = await _rv(session, widgets(w, second, "*"))
    assert behind < ahead
    for query in (
        f"?resourceVersion={behind}&resourceVersionMatch=NotOlderThan",
        f"?resourceVersion={behind}&resourceVersionMatch=Exact",
    ):
        code, body = await call(session, "GET", widgets(w, root, "*") + query)
        assert code in (200, 410), (query, body)
        if code == 200:
            clusters = {i["metadata"]["annotations"]["kcp.io/cluster"] for i in body["items"]}
            assert clusters <= {mine.cluster}, (query, clusters)
    # This shard's own resourceVersions keep working.
    code, body = await call(
        session,
        "GET",
        widgets(w, second, "*") + f"?resourceVersion={behind}&resourceVersionMatch=NotOlderThan",
    )
    assert code == 200, body
