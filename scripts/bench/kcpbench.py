"""LIST time against object count with a real kcp as the upstream (its APIExport VW).

The benchmark starts its own kcp (``scripts/kcp/build.sh``'s binary), bootstraps the demo
world and grows one consumer's widgets to each object count in turn (half of them
``env=prod``, the slice's half). Objects are created concurrently but bounded, since kcp on two
cores answers creates at a rate that more requests in flight do not raise, only queue. At each
count a pass-through vwserver and a cache vwserver run side by side and every path is timed in
turn, against the direct call of the same shape (unpaged with the slice's labelSelector, or
paged by the client with limit=500 like kubectl).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
from harness import (
    API,
    SELECTOR,
    WATCH_PARAMS,
    Proxy,
    ServingTLS,
    cache_reads,
    list_once,
    make_serving_tls,
    note_cache_reads,
    paged,
    peak_rss_kib,
    timed_rounds,
    vwserver,
    watch_once,
)
from harness import session as bench_session
from lists import record_lists, record_watch
from results import Results

if TYPE_CHECKING:
    from devenv.bootstrap import Bootstrap
    from devenv.kcp import KcpInstance

CREATE_AT_ONCE = 32
PAGED = "direct, client pages"
SETTLE = 5.0  # seconds for kcp's own work after a burst of creates, before timing


async def create_widgets(session: aiohttp.ClientSession, url: str, numbers: Iterable[int]) -> None:
    gate = asyncio.Semaphore(CREATE_AT_ONCE)

    async def create(i: int) -> None:
        body = {
            "apiVersion": "example.io/v1alpha1",
            "kind": "Widget",
            "metadata": {
                "name": f"bench-{i:06d}",
                "labels": {"env": ("prod", "dev")[i % 2], "bench": "yes"},
            },
            "spec": {"size": i % 100, "color": "red"},
        }
        async with gate, session.post(url, json=body) as r:
            if r.status not in (201, 409):
                raise RuntimeError(f"creating bench-{i:06d}: {r.status} {await r.text()}")

    await asyncio.gather(*(create(i) for i in numbers))


@contextlib.asynccontextmanager
async def kcp_world() -> AsyncIterator[tuple[KcpInstance, Bootstrap]]:
    """A kcp of the benchmark's own with the demo world bootstrapped, stopped when the block
    ends: ``$KCP_BINARY`` (as the tests take it), else ``scripts/kcp/build.sh``'s (cached)."""
    # devenv is importable once harness has put the repository on the path.
    from devenv.bootstrap import DEMO_USERS_FILE, bootstrap
    from devenv.kcp import build_kcp, start_kcp

    given = os.environ.get("KCP_BINARY")
    binary = Path(given) if given else await asyncio.to_thread(build_kcp)
    async with start_kcp(binary=binary, token_auth_file=DEMO_USERS_FILE) as kcp:
        yield kcp, await bootstrap(kcp)


async def bench_kcp(
    results: Results, counts: tuple[int, ...], *, repeat: int, page_size: int
) -> None:
    async with kcp_world() as (kcp, world):
        ws = world.consumer("consumer-a")
        url = f"{kcp.url}/clusters/{ws.path}/{world.api_path}/namespaces/team-red/widgets"
        made = 0
        for objects in sorted(counts):
            started = time.perf_counter()
            async with kcp.http_session(timeout=600) as s:
                await create_widgets(s, url, range(made, objects))
            took = time.perf_counter() - started
            note = (
                f"kcp: created {objects - made:,} widgets in {took:.0f} s "
                f"({(objects - made) / took:,.0f}/s, {CREATE_AT_ONCE} in flight), "
                f"{objects:,} in all"
            )
            print(note, flush=True)
            results.notes.append(note)
            made = objects
            await asyncio.sleep(SETTLE)
            await measure(
                results,
                kcp,
                world,
                objects,
                repeat=repeat,
                page_size=page_size,
                watch=objects == min(counts),
            )


async def measure(
    results: Results,
    kcp: KcpInstance,
    world: Bootstrap,
    objects: int,
    *,
    repeat: int,
    page_size: int,
    watch: bool,
) -> None:
    direct_url = f"{world.vw_url}/clusters/*{API}"
    selected = {"labelSelector": SELECTOR}
    async with (
        kcp_vwserver(kcp, world, page_size=page_size, cache=False) as px,
        kcp_vwserver(kcp, world, page_size=page_size, cache=True) as cx,
        bench_session(
            headers={"Authorization": f"Bearer {kcp.admin_token}"}, ssl_context=kcp.ssl_context()
        ) as s,
    ):
        calls = {
            "direct": lambda: list_once(s, direct_url, selected),
            "pass-through": lambda: list_once(s, px.list_url, {}),
            "cache": lambda: list_once(s, cx.list_url, {}),
            "cache rv=0": lambda: list_once(s, cx.list_url, {"resourceVersion": "0"}),
            PAGED: lambda: paged(s, direct_url, selected),
            "pass-through, client pages": lambda: paged(s, px.list_url, {}),
            "cache, client pages": lambda: paged(s, cx.list_url, {}),
        }
        await timed_rounds(calls, 1)  # warm up; the cache's first LIST and sync
        timings = await timed_rounds(calls, repeat)
        record_lists(
            results,
            "kcp",
            objects,
            timings,
            (
                ("pass-through", "passthrough", "direct", "≤ 1.10"),
                (
                    "pass-through, client pages",
                    "passthrough_pages",
                    "direct, client pages",
                    "≤ 1.10",
                ),
                ("cache", "cache", "direct", "≤ 0.25"),
                ("cache rv=0", "cache_rv0", "direct", "≤ 0.25"),
                ("cache, client pages", "cache_pages", PAGED, "≤ 0.25"),
            ),
        )
        note_cache_reads(results, f"kcp, {objects:,} objects", await cache_reads(cx))
        print(
            f"{'':<44} peak RSS pass-through {peak_rss_kib(px.pid) / 1024:.1f} MiB, "
            f"cache {peak_rss_kib(cx.pid) / 1024:.1f} MiB"
        )
        if watch:
            w = await timed_rounds(
                {
                    "direct": lambda: watch_once(s, direct_url, {**WATCH_PARAMS, **selected}),
                    "proxy": lambda: watch_once(s, px.list_url, WATCH_PARAMS),
                },
                repeat,
            )
            record_watch(results, "kcp", w)


@dataclass(frozen=True)
class TlsProxy:
    """A vwserver serving TLS in front of kcp, and how clients trust both."""

    proxy: Proxy
    #: kcp's CA and vwserver's serving CA in one file, for processes that take one CA file.
    ca_bundle: Path

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_bundle))


@contextlib.asynccontextmanager
async def kcp_tls_vwserver(
    kcp: KcpInstance,
    world: Bootstrap,
    *,
    page_size: int,
    cache: bool,
    vw_url: str | None = None,
) -> AsyncIterator[TlsProxy]:
    """:func:`kcp_vwserver` serving TLS (a throwaway trustme CA), like kcp: a client's path
    to the slice and to kcp directly then cost the same handshakes and encryption, and kubectl
    sends its bearer token (client-go sends none to a plain-HTTP server: kubectl against
    ``http://`` vwserver gets 401 on discovery, with ``--token`` too). ``vw_url``: the
    export's VW URL to serve (one shard's; default the world's first)."""
    with tempfile.TemporaryDirectory() as tmp:
        tls = make_serving_tls(Path(tmp))
        bundle = Path(tmp) / "ca-bundle.crt"
        bundle.write_bytes(kcp.ca_file.read_bytes() + b"\n" + tls.ca_file.read_bytes())
        async with kcp_vwserver(
            kcp, world, page_size=page_size, cache=cache, tls=tls, vw_url=vw_url
        ) as px:
            yield TlsProxy(px, bundle)


@contextlib.asynccontextmanager
async def admin_over_cached_slice(
    kcp: KcpInstance, world: Bootstrap, *, page_size: int, vw_url: str | None = None
) -> AsyncIterator[tuple[TlsProxy, aiohttp.ClientSession]]:
    """A cached TLS vwserver (:func:`kcp_tls_vwserver`, of ``vw_url``) and a session as kcp's
    admin that trusts both it and kcp: the writes, consistent-read and shards arms' setup."""
    async with (
        kcp_tls_vwserver(kcp, world, page_size=page_size, cache=True, vw_url=vw_url) as tp,
        bench_session(
            headers={"Authorization": f"Bearer {kcp.admin_token}"},
            ssl_context=tp.ssl_context(),
        ) as s,
    ):
        yield tp, s


@contextlib.asynccontextmanager
async def kcp_vwserver(
    kcp: KcpInstance,
    world: Bootstrap,
    *,
    page_size: int,
    cache: bool,
    tls: ServingTLS | None = None,
    vw_url: str | None = None,
) -> AsyncIterator[Proxy]:
    """vwserver in front of kcp's APIExport VW (``vw_url``, default the world's first), as
    kcp's admin, slice ``prod`` (env=prod)."""
    async with vwserver(
        "",
        page_size=page_size,
        cache=cache,
        tls=tls,
        upstream_yaml=f"{{kubeconfig: {kcp.kubeconfig}, context: {kcp.admin_context}}}",
        slice_yaml=f"upstreamURL: {vw_url or world.vw_url}",
        slice_cluster=world.provider.cluster,
    ) as proxy:
        yield proxy
