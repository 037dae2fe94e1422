"""What ``vwserver serve`` says while it cannot reach (parts of) kcp: ``/readyz`` stays ``200``
and names what fails; the slice's ``UpstreamReachable`` condition follows the watch cache's
watches of its export.

Readiness does not depend on kcp (every replica reads the same kcp: failing readiness would take
them all out of their Service at once, and clients would get refused connections instead of the
slices' 503 Status). What fails is added as ``upstream: …`` lines: the slice controller's watch
of slices (here against a stand-in for kcp that starts answering 503) and the shared watch
cache's upstream watches (here against a port nobody listens on). The lines carry no URL and no
error text, since ``/readyz`` is unauthenticated.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import aiohttp
from aiohttp import web

from tests.integration.test_controller_follows_exports import CONSENT, FakeKcp
from tests.support.clock import FakeClock
from tests.support.serve import NO_AUTH, serve_app
from vwserver.cache.registry import CacheRegistry
from vwserver.controller.slice_status import WatchHealth
from vwserver.controller.slices import ControllerSettings, SliceController
from vwserver.k8s.backoff import Backoff
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.metrics import upstream_name
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Routes
from vwserver.server import build_app, watch_health

WAIT = 10.0
UNREACHABLE = "http://127.0.0.1:1"  # nobody listens on port 1


async def until(what: str, check: Callable[[], bool]) -> None:
    try:
        async with asyncio.timeout(WAIT):
            while not check():  # noqa: ASYNC110 - polling state of the code under test
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def readyz(session: aiohttp.ClientSession, base: str) -> tuple[int, str]:
    async with session.get(base + "/readyz") as r:
        return r.status, await r.text()


async def test_readyz_names_failing_upstream_watches_and_stays_ready() -> None:
    failing: list[str] = []
    async with (
        KubeClient(auth=ClientAuth(server=UNREACHABLE)) as client,
        aiohttp.ClientSession() as session,
    ):
        cache = CacheRegistry(
            client=client, clock=FakeClock(), backoff=Backoff(initial=60, maximum=60)
        )
        try:
            app = build_app(
                routes=Routes(),
                upstream=UpstreamClient(auth=ClientAuth(server=UNREACHABLE)),
                guard=NO_AUTH,
                ready=lambda: True,
                failing=lambda: failing,
                cache=cache,
            )
            async with serve_app(app) as base:
                assert await readyz(session, base) == (200, "ok")
                resource = await cache.acquire(
                    upstream=UNREACHABLE + "/services/apiexport/x/y", api_path="/api/v1/pods"
                )
                await until("the cache's list failed", lambda: resource.last_error is not None)
                failing.append("the slice controller's watch of slices fails (1 of 1)")
                status, text = await readyz(session, base)
                assert status == 200
                assert text.splitlines() == [
                    "ok",
                    "upstream: the slice controller's watch of slices fails (1 of 1)",
                    "upstream: the watch cache's upstream watches fail (1 of 1; shard "
                    f"{upstream_name(UNREACHABLE).shard})",
                ]
                assert "127.0.0.1" not in text and "pods" not in text
                # the slice condition's count: only the watches of the slice's export URLs
                export = UNREACHABLE + "/services/apiexport/x/y"
                assert watch_health(cache, [export + "/"]) == WatchHealth(failing=1, total=1)
                assert watch_health(cache, [export + "z"]) == WatchHealth(failing=0, total=0)
                cache.release(resource)
        finally:
            await cache.aclose()


class FailingKcp(FakeKcp):
    """The stand-in for kcp whose watch of slices fails (503) while :attr:`down`: an open
    watch ends when it goes down, and every new one is refused until it is up again."""

    def __init__(self) -> None:
        super().__init__()
        self.up = asyncio.Event()
        self.up.set()

    async def slices(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            return await super().slices(request)
        if not self.up.is_set():
            body = {"kind": "Status", "code": 503, "reason": "ServiceUnavailable"}
            return web.json_response(body, status=503)
        response = web.StreamResponse()
        await response.prepare(request)
        while self.up.is_set():  # noqa: ASYNC110 - the stream stays open until kcp "goes down"
            await asyncio.sleep(0.02)
        return response


@contextlib.asynccontextmanager
async def controller_over(
    kcp: FakeKcp, *, resync: float, retry: float, **options: Any
) -> AsyncIterator[SliceController]:
    """A running controller against the stand-in ``kcp`` (whose export exists and consents)."""
    kcp.auth.consent(**CONSENT)
    kcp.export_exists = True
    kcp.appeared.set()
    async with serve_app(kcp.app()) as base, KubeClient(auth=ClientAuth(server=base)) as client:
        kcp.base = base
        controller = SliceController(
            client=client,
            routes=Routes(),
            settings=ControllerSettings(
                export_path="root:vwserver",
                external_url="https://vw.example",
                resync=resync,
                retry=Backoff(initial=retry, maximum=retry),
            ),
            **options,
        )
        task = asyncio.create_task(controller.run())
        try:
            yield controller
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await controller.aclose()


async def test_the_controller_says_while_its_watch_of_slices_fails() -> None:
    kcp = FailingKcp()
    async with controller_over(kcp, resync=60.0, retry=0.05) as controller:
        await until("slices listed", controller.synced.is_set)
        assert controller.failing() == []
        kcp.up.clear()
        await until("the failure reported", lambda: controller.failing() != [])
        assert controller.failing() == ["the slice controller's watch of slices fails (1 of 1)"]
        kcp.up.set()
        await until("recovered", lambda: controller.failing() == [])


async def test_the_slice_condition_follows_the_cache_watches_of_its_export() -> None:
    """``UpstreamReachable`` is recomputed when the health of the cache's watches of the slice's
    export changes — within seconds, not at the next resync (an hour here) — and written while
    the controller can still reach kcp (with several shards, one export's can fail alone)."""
    kcp = FakeKcp()
    health = [WatchHealth(failing=0, total=2)]
    asked: list[tuple[str, ...]] = []

    def watches(urls: Sequence[str]) -> WatchHealth:
        asked.append(tuple(urls))
        return health[0]

    def reachable() -> str | None:
        if not kcp.statuses:
            return None
        found = [c for c in kcp.statuses[-1]["conditions"] if c["type"] == "UpstreamReachable"]
        return f"{found[0]['status']} {found[0]['reason']}" if found else None

    async with controller_over(
        kcp, resync=3600.0, retry=3600.0, upstream_watches=watches, upstream_check=0.05
    ):
        await until("Watching", lambda: reachable() == "True Watching")
        assert set(asked) == {(f"{kcp.base}/services/apiexport/exportid/widgets.example.io",)}
        health[0] = WatchHealth(failing=1, total=2)
        await until("WatchesFailing", lambda: reachable() == "False WatchesFailing")
        health[0] = WatchHealth(failing=0, total=3)
        await until("Watching again", lambda: reachable() == "True Watching")
