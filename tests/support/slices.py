"""vwserver's proxy in front of the test bed's kcp, serving slices of the demo export."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Collection, Mapping

from devenv.bootstrap import Bootstrap
from devenv.kcp import KcpInstance
from tests.support.serve import NO_AUTH, serve_app
from vwserver.cache.registry import CacheRegistry
from vwserver.clock import Clock, SystemClock
from vwserver.holds import DEFAULT_HOLD_TIMEOUT_SECONDS
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import load_kubeconfig
from vwserver.listener import ConnectionLimits
from vwserver.metrics import ServerMetrics
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
    cache: bool | CacheRegistry = False,
    limits: ConnectionLimits | None = None,
    hold_timeouts: Mapping[str, float] | None = None,
    uncached: Collection[str] = (),
    handoff_interval: float = 2.0,
    clock: Clock | None = None,
    upstream: Callable[..., UpstreamClient] = UpstreamClient,
    mutating_admission: bool = False,
) -> AsyncIterator[str]:
    """Serve ``slices`` (name → selector, in the provider's workspace) over the demo export's
    virtual workspace, unauthenticated (``NO_AUTH``), vwserver reading kcp as kcp's admin;
    yields the server's base URL. A small ``page_size`` makes every list many upstream pages;
    ``cache``: LIST and WATCH are served from the shared watch cache (this registry, or a new
    one reading kcp as its admin, on ``clock``, default the system's), which also runs the
    handoff loop every ``handoff_interval`` seconds; ``hold_timeouts``: per slice name, how
    long it may hold an object leaving it; ``uncached``: slices whose reads always go to kcp
    (they record no holds); ``limits``: the listener's (default: the
    config's); ``upstream``: the proxy's upstream client, made with ``auth=`` (e.g. one that records
    what it sends, :class:`tests.support.upstream_record.RecordingUpstream`);
    ``mutating_admission``: the config's ``mutatingAdmission``."""
    auth = await load_kubeconfig(kcp.kubeconfig, context=kcp.admin_context)
    routes = Routes(
        RouteTable(
            Route(
                cluster=world.provider.cluster,
                name=name,
                selector=selector,
                upstream_url=world.vw_url,
                hold_timeout=(hold_timeouts or {}).get(name, DEFAULT_HOLD_TIMEOUT_SECONDS),
                cache=name not in uncached,
            )
            for name, selector in slices.items()
        )
    )
    async with contextlib.AsyncExitStack() as stack:
        registry = cache if isinstance(cache, CacheRegistry) else None
        # One registry of metrics for the proxy and a cache made here, as vwserver serve has.
        metrics = ServerMetrics()
        if cache is True:
            client = await stack.enter_async_context(KubeClient(auth=auth))
            registry = CacheRegistry(client=client, clock=clock or SystemClock(), metrics=metrics)
            stack.push_async_callback(registry.aclose)
        app = build_app(
            routes=routes,
            upstream=upstream(auth=auth),
            page_size=page_size,
            mutating_admission=mutating_admission,
            guard=NO_AUTH,
            metrics=metrics,
            cache=registry,
            handoff_interval=handoff_interval,
        )
        yield await stack.enter_async_context(serve_app(app, limits=limits))


def slice_url(base: str, world: Bootstrap, name: str, cluster: str) -> str:
    """The URL of slice ``name`` (served by :func:`slices_over_kcp` at ``base``) for logical
    cluster ``cluster`` (``*``: every consumer)."""
    return f"{base}/services/filtered-apiexport/{world.provider.cluster}/{name}/clusters/{cluster}"
