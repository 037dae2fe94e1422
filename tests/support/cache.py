"""The shared watch cache in tests: whether it answered a read, and a server pair to compare.

The cache falls back to kcp whenever it cannot answer exactly, and both paths answer the same;
so a test that means the cache says so with vwserver's own count of the reads it took
(``vwserver_cache_reads_total{verb,outcome}``). :func:`cached_and_direct` serves the same slices
twice in front of one fake upstream — reads from the cache, and reads passed to the upstream —
for tests that compare the two; :func:`cached_proxy` serves them once, with the cache.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

from fakekcp.upstream import FakeUpstream, start_fake_upstream
from tests.support.serve import NO_AUTH, serve_app
from vwserver.cache.registry import CacheRegistry
from vwserver.clock import Clock, SystemClock
from vwserver.controller.handoff import Handoff
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.metrics import ServerMetrics
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Routes, RouteTable
from vwserver.server import build_app, health_listener_app


async def cache_reads(
    session: aiohttp.ClientSession, base: str, *, verb: str, outcome: str
) -> float:
    """How many ``verb`` reads vwserver at ``base`` counted as ``outcome`` (``served`` from the
    cache, ``fallback`` to kcp)."""
    async with session.get(f"{base}/metrics") as r:
        text = await r.text()
    for line in text.splitlines():
        if line.startswith("vwserver_cache_reads_total{") and (
            f'verb="{verb}"' in line and f'outcome="{outcome}"' in line
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def until_counted(
    session: aiohttp.ClientSession,
    base: str,
    *,
    verb: str,
    outcome: str,
    count: float,
    within: float = 10.0,
) -> None:
    """Wait until vwserver counted ``count`` such reads, and no more. A watch is counted when
    it ends: after its client left, which the server notices on its own time."""
    async with asyncio.timeout(within):
        while await cache_reads(session, base, verb=verb, outcome=outcome) < count:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    assert await cache_reads(session, base, verb=verb, outcome=outcome) == count


@dataclass
class _Upstream:
    fake: FakeUpstream
    vw_url: str
    auth: ClientAuth
    """vwserver's identity at the fake."""
    registry: CacheRegistry
    metrics: ServerMetrics
    """Where the cache counts (and the server with it)."""


@contextlib.asynccontextmanager
async def _cached_upstream(
    upstream: FakeUpstream,
    *,
    token: str,
    seed: Callable[[FakeUpstream], object],
    clock: Clock | None = None,
    **cache: Any,
) -> AsyncIterator[_Upstream]:
    """``upstream`` started and ``seed``-ed, and a shared watch cache reading it as vwserver
    (``token``; ``clock``, ``cache``: the registry's options), closed at the end."""
    async with start_fake_upstream(upstream) as (fake, vw_url):
        seed(fake)
        origin = vw_url.removesuffix(fake.base_path)
        auth = ClientAuth(server=origin, token=token)
        async with KubeClient(auth=auth) as client:
            metrics = ServerMetrics()
            registry = CacheRegistry(
                client=client, clock=clock or SystemClock(), metrics=metrics, **cache
            )
            try:
                yield _Upstream(fake, vw_url, auth, registry, metrics)
            finally:
                await registry.aclose()


@dataclass
class CachedAndDirect:
    fake: FakeUpstream
    cached: str
    """The server that reads from the cache."""
    direct: str
    """The server that passes every read to the upstream."""
    session: aiohttp.ClientSession
    registry: CacheRegistry
    cached_health: str
    """The health listener (on loopback: with ``/debug/cache``) of the server with the cache."""


@contextlib.asynccontextmanager
async def cached_and_direct(
    upstream: FakeUpstream,
    *,
    routes: Callable[[str], RouteTable],
    token: str,
    seed: Callable[[FakeUpstream], None],
    clock: Clock | None = None,
    within: float = 10.0,
) -> AsyncIterator[CachedAndDirect]:
    """``upstream`` started and ``seed``-ed, and two servers of ``routes(<its URL>)`` in front
    of it (vwserver's identity: ``token``; lists paged upstream two by two); the cache reads
    with ``clock``. ``within``: the session's timeout."""
    async with _cached_upstream(
        upstream, token=token, seed=seed, clock=clock, idle_seconds=60
    ) as up:
        apps = [
            build_app(
                routes=Routes(routes(up.vw_url)),
                upstream=UpstreamClient(auth=up.auth),
                page_size=2,
                guard=NO_AUTH,
                cache=cache,
                metrics=up.metrics if cache is not None else None,
            )
            for cache in (up.registry, None)
        ]
        async with (
            serve_app(apps[0]) as cached,
            serve_app(apps[1]) as direct,
            serve_app(health_listener_app(apps[0], debug_cache=True)) as cached_health,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=within)) as session,
        ):
            yield CachedAndDirect(up.fake, cached, direct, session, up.registry, cached_health)


@dataclass
class CachedProxy:
    fake: FakeUpstream
    upstream: str
    """The fake's virtual-workspace URL (a consumer's own requests go there directly)."""
    base: str
    """The server, which reads from the shared cache."""
    session: aiohttp.ClientSession
    metrics: ServerMetrics
    """Where the server counts (its ``/metrics``)."""
    handoff: Handoff | None
    """The handoff loop the app runs, when the test made it (else the app's default one)."""


_Proxy = TypeVar("_Proxy", bound=CachedProxy)


@contextlib.asynccontextmanager
async def cached_proxy(
    upstream: FakeUpstream,
    *,
    routes: Callable[[str], RouteTable],
    token: str,
    within: float,
    seed: Callable[[FakeUpstream], object] = lambda _: None,
    page_size: int | None = None,
    handoff: Callable[[CacheRegistry, Routes, ServerMetrics], Handoff] | None = None,
    world: Callable[..., _Proxy],
) -> AsyncIterator[_Proxy]:
    """``upstream`` started and ``seed``-ed, and one server of ``routes(<its URL>)`` in front
    of it with the shared watch cache (vwserver's identity: ``token``; ``page_size``: the
    upstream list pages, None: the server's default; ``handoff``: the handoff loop it runs,
    None: the default one). Yields ``world(**parts)`` of :class:`CachedProxy`'s fields (the
    class, or a test's subclass of it). ``within``: the session's timeout."""
    async with _cached_upstream(upstream, token=token, seed=seed) as up:
        table = Routes(routes(up.vw_url))
        loop = handoff(up.registry, table, up.metrics) if handoff is not None else None
        paging: dict[str, Any] = {} if page_size is None else {"page_size": page_size}
        app = build_app(
            routes=table,
            upstream=UpstreamClient(auth=up.auth),
            guard=NO_AUTH,
            cache=up.registry,
            metrics=up.metrics,
            handoff=loop,
            **paging,
        )
        async with (
            serve_app(app) as base,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=within)) as session,
        ):
            yield world(
                fake=up.fake,
                upstream=up.vw_url,
                base=base,
                session=session,
                metrics=up.metrics,
                handoff=loop,
            )
