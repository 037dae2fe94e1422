"""vwserver's proxy in front of the test bed's kcp, serving slices of the demo export."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping

from devenv.bootstrap import Bootstrap
from devenv.kcp import KcpInstance
from tests.support.serve import NO_AUTH, serve_app
from vwserver.k8s.kubeconfig import load_kubeconfig
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Route, Routes, RouteTable
from vwserver.selector import Selector
from vwserver.server import build_app


@contextlib.asynccontextmanager
async def slices_over_kcp(
    kcp: KcpInstance,
    world: Bootstrap,
    *,
    slices: Mapping[str, Selector],
    page_size: int,
) -> AsyncIterator[str]:
    """Serve ``slices`` (name → selector, in the provider's workspace) over the demo export's
    virtual workspace, unauthenticated (``NO_AUTH``), vwserver reading kcp as kcp's admin;
    yields the server's base URL. A small ``page_size`` makes every list many upstream pages."""
    auth = await load_kubeconfig(kcp.kubeconfig, context=kcp.admin_context)
    routes = Routes(
        RouteTable(
            Route(
                cluster=world.provider.cluster,
                name=name,
                selector=selector,
                upstream_url=world.vw_url,
            )
            for name, selector in slices.items()
        )
    )
    app = build_app(
        routes=routes, upstream=UpstreamClient(auth=auth), page_size=page_size, guard=NO_AUTH
    )
    async with serve_app(app) as base:
        yield base
