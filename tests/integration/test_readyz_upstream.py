"""``/readyz`` of ``vwserver serve`` says what of kcp it cannot reach, and stays ``200``.

Readiness does not depend on kcp (every replica reads the same kcp: failing readiness would take
them all out of their Service at once, and clients would get refused connections instead of the
slices' 503 Status). What fails is added as ``upstream: …`` lines: the slice controller's watch
of slices (here against a stand-in for kcp that starts answering 503) and the shared watch
cache's upstream watches (here against a port nobody listens on). The lines carry no URL and no
error text, since ``/readyz`` is unauthenticated.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
from aiohttp import web

from tests.integration.test_controller_follows_exports import CONSENT, FakeKcp
from tests.support.clock import FakeClock
from tests.support.serve import NO_AUTH, serve_app
from vwserver.cache.registry import CacheRegistry
from vwserver.controller.slices import ControllerSettings, SliceController
from vwserver.k8s.backoff import Backoff
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Routes
from vwserver.server import build_app

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
                    "upstream: the watch cache's upstream watches fail (1 of 1)",
                ]
                assert "127.0.0.1" not in text and "pods" not in text
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


async def test_the_controller_says_while_its_watch_of_slices_fails() -> None:
    kcp = FailingKcp()
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
                resync=60.0,
                retry=Backoff(initial=0.05, maximum=0.05),
            ),
        )
        task = asyncio.create_task(controller.run())
        try:
            await until("slices listed", controller.synced.is_set)
            assert controller.failing() == []
            kcp.up.clear()
            await until("the failure reported", lambda: controller.failing() != [])
            assert controller.failing() == ["the slice controller's watch of slices fails (1 of 1)"]
            kcp.up.set()
            await until("recovered", lambda: controller.failing() == [])
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await controller.aclose()
