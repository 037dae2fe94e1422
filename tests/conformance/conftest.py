"""Fixtures of the differential harness: vwserver in front of the session's real kcp with one
slice (``prod``: ``env=prod``), and an HTTP session that reaches both vwserver and kcp."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest_asyncio

from devenv.bootstrap import Bootstrap
from devenv.kcp import KcpInstance
from tests.support.serve import NO_AUTH, serve_app
from vwserver.k8s.kubeconfig import ClientAuth, load_kubeconfig
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Route, Routes, RouteTable
from vwserver.selector import Selector
from vwserver.server import build_app

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


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def pair(kcp: KcpInstance, world: Bootstrap) -> AsyncIterator[Pair]:
    auth = await load_kubeconfig(kcp.kubeconfig, context=kcp.admin_context)
    routes = Routes(
        RouteTable(
            [
                Route(
                    cluster=world.provider.cluster,
                    name=SLICE,
                    selector=SELECTOR,
                    upstream_url=world.vw_url,
                )
            ]
        )
    )
    # A small page size: unpaged lists through the slice are then assembled from many pages.
    app = build_app(routes=routes, upstream=UpstreamClient(auth=auth), page_size=3, guard=NO_AUTH)
    connector = aiohttp.TCPConnector(ssl=auth.ssl_context())
    async with (
        serve_app(app) as base,
        aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=60)
        ) as session,
    ):
        yield Pair(base, kcp, world, auth, session)
