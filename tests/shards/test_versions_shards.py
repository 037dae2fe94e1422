"""resourceVersions and continue tokens are per shard (issue #24 point 3): each shard is its
own etcd, so a token from one shard's endpoint means nothing on another's.

kcp v0.32.3 facts, observed on this bed with kcp's own VWs (shard 1 at rv ~670, shard 2 at rv
~390): shard 1's continue token, or ``resourceVersion=<shard 1's rv>`` with ``Exact`` or
``NotOlderThan``, sent to shard 2's VW gets no answer for at least 12 s (the apiserver waits for
a revision its etcd has not reached); a watch from that rv is 200 with no event until its
``timeoutSeconds`` (the other direction, an rv lower than the shard's own, was not tried: kcp's
tokens and resourceVersions carry no shard, so nothing there tells a client it mixed shards).
vwserver's cache tokens name the shard they came from, so there they are a 400; a bare
resourceVersion carries no shard, but one newer than the shard's current is a 410 Expired
(tests/shards/test_foreign_shards.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import quote

import aiohttp
import pytest_asyncio

from devenv.shards import ROOT_SHARD, SECOND_SHARD
from tests.e2e.controller_env import Served, unique
from tests.shards.conftest import ShardedWorld
from tests.shards.test_slices_shards import PROD, call, endpoints_by_shard, served, widgets

__all__ = ["served"]  # the module fixture of test_slices_shards, one vwserver per module


@pytest_asyncio.fixture(loop_scope="session")
async def session(sharded_world: ShardedWorld) -> AsyncIterator[aiohttp.ClientSession]:
    async with sharded_world.bed.front.http_session(timeout=30) as s:
        yield s


async def test_a_continue_token_is_good_only_on_the_shard_that_issued_it(
    sharded_world: ShardedWorld, served: Served, session: aiohttp.ClientSession
) -> None:
    w = sharded_world
    name = unique("prod")
    await served.create_slice(w.slices, name, selector=PROD)
    endpoints = await endpoints_by_shard(w, served, name, count=2)
    for here, there in ((ROOT_SHARD, SECOND_SHARD), (SECOND_SHARD, ROOT_SHARD)):
        code, page = await call(session, "GET", widgets(w, endpoints[here], "*") + "?limit=1")
        assert code == 200, page
        token = page["metadata"]["continue"]
        assert token  # each shard's consumer has several prod widgets
        rest = f"?limit=1&continue={quote(token)}"
        code, body = await call(session, "GET", widgets(w, endpoints[there], "*") + rest)
        assert (code, body["reason"]) == (400, "BadRequest"), body
        assert "another shard" in body["message"]
        code, body = await call(session, "GET", widgets(w, endpoints[here], "*") + rest)
        assert code == 200, body
        clusters = {i["metadata"]["annotations"]["kcp.io/cluster"] for i in body["items"]}
        assert clusters == {w.consumer_on(here).cluster}
