"""Fixtures of the differential harness: vwserver in front of the session's real kcp with one
slice (``prod``: ``env=prod``), and an HTTP session that reaches both vwserver and kcp."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
import pytest_asyncio

from devenv.bootstrap import Bootstrap
from devenv.kcp import KcpInstance
from tests.support.cache import cache_reads, until_counted
from tests.support.slices import slices_over_kcp
from vwserver.k8s.kubeconfig import ClientAuth, load_kubeconfig
from vwserver.selector import Selector

SLICE = "prod"
SELECTOR = Selector.parse("env=prod")


@dataclass
class Pair:
    """Where a request goes: through the slice, or directly to kcp's virtual workspace."""

    proxy_base: str
    kcp: KcpInstance
    world: Bootstrap
    auth: ClientAuth
    session: aiohttp.ClientSession
    cached: bool = False
    """Reads through the slice come from the shared watch cache (else kcp answers them)."""

    @property
    def token(self) -> str:
        token = self.auth.bearer_token()
        assert token is not None
        return token

    def cluster(self, name: str) -> str:
        return "*" if name == "*" else self.world.consumer(name).cluster

    def slice_url(self, cluster: str) -> str:
        return (
            f"{self.proxy_base}/services/filtered-apiexport/{self.world.provider.cluster}/"
            f"{SLICE}/clusters/{self.cluster(cluster)}"
        )

    def direct_url(self, cluster: str) -> str:
        return f"{self.world.vw_url}/clusters/{self.cluster(cluster)}"

    async def cache_reads(self, verb: str, outcome: str) -> float:
        """``vwserver_cache_reads_total{verb,outcome}``: how many reads the cache took."""
        return await cache_reads(self.session, self.proxy_base, verb=verb, outcome=outcome)

    async def served_from_cache(self, verb: str, before: float) -> None:
        """The cache served one more ``verb`` than ``before``; with the pass-through fixture,
        it served nothing."""
        if not self.cached:
            assert await self.cache_reads(verb, "served") == 0
            return
        await until_counted(
            self.session, self.proxy_base, verb=verb, outcome="served", count=before + 1
        )


@pytest_asyncio.fixture(scope="session", loop_scope="session", params=["passthrough", "cache"])
async def pair(
    request: pytest.FixtureRequest, kcp: KcpInstance, world: Bootstrap
) -> AsyncIterator[Pair]:
    """Both read paths answer every case: reads passed to kcp, and reads from the shared
    watch cache."""
    auth = await load_kubeconfig(kcp.kubeconfig, context=kcp.admin_context)
    connector = aiohttp.TCPConnector(ssl=auth.ssl_context())
    # A small page size: unpaged lists through the slice are then assembled from many pages.
    async with (
        slices_over_kcp(
            kcp, world, slices={SLICE: SELECTOR}, page_size=3, cache=request.param == "cache"
        ) as base,
        aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=60)
        ) as session,
    ):
        yield Pair(base, kcp, world, auth, session, cached=request.param == "cache")
