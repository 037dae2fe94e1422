"""A shard goes away (issue #24 point 6): the second shard's kcp process is killed (SIGKILL),
then started again on the same directory and ports.

While it is away: the root shard's endpoint keeps serving; the second shard's answers 503
Status; ``/readyz`` stays 200 and names the shard (the metrics' digest of its origin); the
slice's ``UpstreamReachable`` condition counts the failing watch (the slice lives on the root
shard, where its status can still be written). When it is back the second shard's endpoint lists
exactly kcp's objects again. Churn and informers across the outage are not part of this test
(tests/chaos does that on one shard).

The module restarts the shard whatever happens, so that later modules find the bed whole.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest_asyncio

from devenv.shards import ROOT_SHARD, SECOND_SHARD
from devenv.slices import wait_slice_ready
from tests.e2e.controller_env import Served, condition, eventually, unique
from tests.shards.conftest import ShardedWorld
from tests.shards.test_slices_shards import (
    PROD,
    call,
    kcp_vw_urls,
    keys,
    serving_slices,
    widgets,
)
from vwserver.k8s.kcp import shard_id
from vwserver.metrics import upstream_name

RESTART_TIMEOUT = 240.0


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def served(sharded_world: ShardedWorld) -> AsyncIterator[Served]:
    async with serving_slices(sharded_world, watch_health=True) as served:
        yield served


async def _list(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    status: tuple[int, Any] = await call(session, "GET", url)
    return status


async def test_the_other_endpoint_serves_while_a_shard_is_away(
    sharded_world: ShardedWorld, served: Served
) -> None:
    w = sharded_world
    shard = w.bed.shard(SECOND_SHARD)
    name = unique("prod")
    await served.create_slice(w.world.provider, name, selector=PROD)
    await wait_slice_ready(w.bed.front, w.world.provider, name, within=60)
    ids = {shard_id(u): w.bed.shard_of_url(u) for u in await kcp_vw_urls(w, w.world.export_name)}

    async def endpoints() -> dict[str, str] | None:
        status = await served.slice_status(w.world.provider, name)
        urls = [e["url"] for e in status.get("endpoints") or []]
        return {ids[u.rpartition("/shards/")[2]]: u for u in urls} if len(urls) == 2 else None

    by_shard = await eventually(endpoints, within=60, what="two endpoints")
    expected = {}
    async with w.bed.front.http_session(timeout=20) as session:
        for s, url in by_shard.items():
            code, body = await _list(session, widgets(w, url, "*"))
            assert code == 200, body
            expected[s] = keys(body)
        try:
            await shard.process.kill()

            async def down() -> Any:
                code, body = await _list(session, widgets(w, by_shard[SECOND_SHARD], "*"))
                return body if code == 503 else None

            body = await eventually(down, within=120, what="503 from the shard that is away")
            assert (body["kind"], body["code"]) == ("Status", 503)
            code, body = await _list(session, widgets(w, by_shard[ROOT_SHARD], "*"))
            assert code == 200, body
            assert keys(body) == expected[ROOT_SHARD]

            async def unreachable() -> dict[str, Any] | None:
                got = condition(
                    await served.slice_status(w.world.provider, name), "UpstreamReachable"
                )
                return got if got.get("status") == "False" else None

            got = await eventually(unreachable, within=120, what="UpstreamReachable=False")
            assert got["reason"] == "WatchesFailing"
            assert got["message"].startswith("1 of 2 ")

            digest = upstream_name(shard.url).shard
            async with (
                aiohttp.ClientSession() as plain,
                plain.get(served.base + "/readyz") as resp,
            ):
                assert resp.status == 200
                text = await resp.text()
            assert f"shard {digest}" in text, text
            assert shard.url not in text
        finally:
            if shard.process.returncode is not None or shard.process.pid is None:
                await shard.process.start()
            await shard.process.wait_ready(timeout=RESTART_TIMEOUT)

        async def back() -> bool | None:
            code, body = await _list(session, widgets(w, by_shard[SECOND_SHARD], "*"))
            return True if code == 200 and keys(body) == expected[SECOND_SHARD] else None

        await eventually(back, within=RESTART_TIMEOUT, what="the shard's endpoint serves again")

        async def reachable() -> bool | None:
            got = condition(await served.slice_status(w.world.provider, name), "UpstreamReachable")
            return True if got.get("status") == "True" else None

        await eventually(reachable, within=120, what="UpstreamReachable=True")
        # kcp's own VW of the shard agrees with what the endpoint shows again.
        code, theirs = await _list(
            session, widgets(w, w.vw_url(SECOND_SHARD), "*") + "?labelSelector=env%3Dprod"
        )
        assert code == 200 and keys(theirs) == expected[SECOND_SHARD], json.dumps(theirs)[:300]
