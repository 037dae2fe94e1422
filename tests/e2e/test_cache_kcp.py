"""The shared watch cache against real kcp: many watches, one upstream watch.

vwserver in front of the session's kcp with the ``prod`` slice served from a cache registry
whose client counts what it asks kcp. A thousand watches on the slice are opened at once, one
object is created directly in kcp, and every watch must deliver it — while kcp saw exactly one
LIST and one WATCH of the resource from vwserver.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncGenerator, Callable, Iterable
from urllib.parse import urlsplit

import aiohttp

from devenv.bootstrap import Bootstrap
from devenv.kcp import KcpInstance
from tests.support.slices import slices_over_kcp
from vwserver.cache.registry import CacheRegistry
from vwserver.clock import SystemClock
from vwserver.k8s.client import KubeClient, RawEvent
from vwserver.k8s.kubeconfig import load_kubeconfig
from vwserver.listener import ConnectionLimits
from vwserver.selector import Selector

WATCHES = 1000
WAIT = 120.0


class CountingClient(KubeClient):
    """vwserver's own client towards kcp, counting the cache's raw lists and watches."""

    lists = 0
    watches = 0

    async def request_raw(
        self,
        method: str,
        path: str,
        *,
        query: Iterable[tuple[str, str]] = (),
        accept: str = "application/json",
    ) -> bytes:
        self.lists += 1
        return await super().request_raw(method, path, query=query, accept=accept)

    def watch_raw(
        self,
        path: str,
        *,
        query: Iterable[tuple[str, str]] = (),
        idle_timeout: float | None = None,
        accept: str = "application/json",
        on_answer: Callable[[], None] | None = None,
    ) -> AsyncGenerator[RawEvent, None]:
        self.watches += 1
        return super().watch_raw(
            path, query=query, idle_timeout=idle_timeout, accept=accept, on_answer=on_answer
        )


async def first_event_named(
    session: aiohttp.ClientSession, url: str, name: str, *, ready: asyncio.Event, opened: list[int]
) -> str:
    """Open a watch; when it is established count it; return the type of the first event
    about ``name``."""
    async with session.get(url, params={"watch": "1", "allowWatchBookmarks": "true"}) as r:
        assert r.status == 200, await r.text()
        opened.append(1)
        if len(opened) == WATCHES:
            ready.set()
        async for line in r.content:
            event = json.loads(line)
            if event["object"].get("metadata", {}).get("name") == name:
                return str(event["type"])
    raise AssertionError("the watch ended before the object arrived")


async def test_a_thousand_watches_are_one_upstream_watch(
    kcp: KcpInstance, world: Bootstrap
) -> None:
    auth = await load_kubeconfig(kcp.kubeconfig, context=kcp.admin_context)
    async with CountingClient(auth=auth) as client:
        registry = CacheRegistry(client=client, clock=SystemClock())
        try:
            async with (
                slices_over_kcp(
                    kcp,
                    world,
                    slices={"prod": Selector.parse("env=prod")},
                    page_size=50,
                    cache=registry,
                    limits=ConnectionLimits(max_connections_per_client=0),
                ) as base,
                aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=0),
                    headers={"Authorization": f"Bearer {auth.bearer_token()}"},
                ) as session,
            ):
                url = (
                    f"{base}/services/filtered-apiexport/{world.provider.cluster}/prod"
                    f"/clusters/*/{world.api_path}/{world.resource}"
                )
                name = f"fanout-{uuid.uuid4().hex[:6]}"
                ready, opened = asyncio.Event(), []
                async with asyncio.timeout(WAIT):
                    watches = [
                        asyncio.create_task(
                            first_event_named(session, url, name, ready=ready, opened=opened)
                        )
                        for _ in range(WATCHES)
                    ]
                    try:
                        try:
                            async with asyncio.timeout(WAIT / 2):
                                await ready.wait()
                        except TimeoutError:
                            failed = [t.exception() for t in watches if t.done()]
                            raise AssertionError(
                                f"{len(opened)} of {WATCHES} watches established; "
                                f"{len(failed)} ended: {failed[:3]!r}"
                            ) from None
                        (stats,) = registry.stats()
                        assert stats["subscribers"] == WATCHES
                        ws = world.consumer("consumer-a")
                        manifest = {
                            "apiVersion": f"{world.group}/{world.version}",
                            "kind": "Widget",
                            "metadata": {
                                "name": name,
                                "namespace": "default",
                                "labels": {"env": "prod"},
                            },
                            "spec": {"size": 1, "color": "red"},
                        }
                        await kcp.kubectl(
                            "apply", "-f", "-", server=ws.url, input=json.dumps(manifest)
                        )
                        types = await asyncio.gather(*watches)
                    finally:
                        for task in watches:
                            task.cancel()
                        await asyncio.gather(*watches, return_exceptions=True)
                assert types == ["ADDED"] * WATCHES
                # One shared resource, listed once and watched once, for a thousand clients.
                assert (client.lists, client.watches) == (1, 1)
                await kcp.kubectl(
                    "delete", "widget", name, "-n", "default", "--ignore-not-found", server=ws.url
                )
        finally:
            await registry.aclose()


async def test_metrics_and_readyz_never_show_kcps_address(
    kcp: KcpInstance, world: Bootstrap
) -> None:
    """``/metrics`` and ``/readyz`` are unauthenticated on the slice listener: with the cache
    following kcp (objects and Tables), they name a resource by its path in the virtual
    workspace and a digest of its shard, never kcp's host:port (#22 finding 13)."""
    host_port = urlsplit(kcp.url).netloc
    path = urlsplit(world.vw_url).path + f"/clusters/*/{world.api_path}/{world.resource}"
    table = "application/json;as=Table;v=v1;g=meta.k8s.io"
    async with (
        slices_over_kcp(
            kcp, world, slices={"prod": Selector.parse("env=prod")}, page_size=50, cache=True
        ) as base,
        aiohttp.ClientSession() as session,
    ):
        url = (
            f"{base}/services/filtered-apiexport/{world.provider.cluster}/prod"
            f"/clusters/*/{world.api_path}/{world.resource}?resourceVersion=0"
        )
        for accept in ("application/json", table):
            async with session.get(url, headers={"Accept": accept}) as r:
                assert r.status == 200, await r.text()
        async with session.get(f"{base}/metrics") as r:
            metrics = await r.text()
        async with session.get(f"{base}/readyz") as r:
            readyz = await r.text()
    assert f'vwserver_cache_synced{{resource="{path}",shard="' in metrics, metrics
    assert f'vwserver_cache_synced{{resource="{path} (as Table)",shard="' in metrics, metrics
    for text in (metrics, readyz):
        assert host_port not in text, text
