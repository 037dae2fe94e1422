"""Leader election against a small in-process Lease API with optimistic concurrency."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from aiohttp import web

from tests.support.clock import FakeClock
from tests.support.relay import Relay
from tests.support.serve import serve_app
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.k8s.lease import LeaderElector

PATH = "/clusters/{ws}/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"


def lease_api() -> web.Application:
    """GET/POST/PUT of Lease objects with resourceVersion conflicts, like the apiserver."""
    store: dict[str, dict[str, Any]] = {}
    namespaces = {"default"}
    rv = [0]

    def status(code: int, reason: str) -> web.Response:
        return web.json_response({"kind": "Status", "code": code, "reason": reason}, status=code)

    async def get(request: web.Request) -> web.Response:
        obj = store.get(request.match_info["name"])
        return web.json_response(obj) if obj else status(404, "NotFound")

    async def create(request: web.Request) -> web.Response:
        obj = await request.json()
        if request.match_info["ns"] not in namespaces:
            return status(404, "NotFound")  # the apiserver: namespaces "x" not found
        name = obj["metadata"]["name"]
        if name in store:
            return status(409, "AlreadyExists")
        rv[0] += 1
        obj["metadata"]["resourceVersion"] = str(rv[0])
        store[name] = obj
        return web.json_response(obj, status=201)

    async def update(request: web.Request) -> web.Response:
        obj = await request.json()
        name = request.match_info["name"]
        if store[name]["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]:
            return status(409, "Conflict")
        rv[0] += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(rv[0])
        store[name] = obj
        return web.json_response(obj)

    async def create_namespace(request: web.Request) -> web.Response:
        obj = await request.json()
        namespaces.add(obj["metadata"]["name"])
        return web.json_response(obj, status=201)

    app = web.Application()
    app.router.add_post("/clusters/{ws}/api/v1/namespaces", create_namespace)
    app.router.add_get(PATH + "/{name}", get)
    app.router.add_post(PATH, create)
    app.router.add_put(PATH + "/{name}", update)
    return app


async def test_one_leader_takeover_after_expiry_and_step_down() -> None:
    clock = FakeClock(start=1000.0)
    async with serve_app(lease_api()) as base, KubeClient(auth=ClientAuth(server=base)) as client:

        def elector(identity: str) -> LeaderElector:
            return LeaderElector(
                client=client, base=f"{base}/clusters/root:vw", namespace="default", name="vw",
                identity=identity, clock=clock, lease_duration=15, renew_deadline=10,
                retry_period=2,
            )  # fmt: skip

        a, b = elector("a"), elector("b")
        await asyncio.wait_for(a.acquire(), 5)
        assert a.is_leader
        # b waits while a's record stands still for less than the lease duration
        started = clock.monotonic()
        await asyncio.wait_for(b.acquire(), 5)  # a never renews: b takes over ...
        assert b.is_leader
        assert clock.monotonic() - started >= 15  # ... only after 15 s on b's own clock
        # a notices it cannot renew and steps down within its renew deadline
        await asyncio.wait_for(a.hold(), 5)
        assert not a.is_leader
        await b.release()
        assert not b.is_leader
        await asyncio.wait_for(a.acquire(), 5)  # a released lease is free at once
        assert a.is_leader


async def test_an_unreachable_server_is_retried_with_backoff_and_never_raises() -> None:
    """The Lease's server (the syncer's downstream cluster) is away when the candidate starts,
    and again while it leads for longer than the renew deadline: ``acquire`` retries with
    backoff (2, 4, 8, 16, 30, 30 … fake seconds; jitter pinned to its top) until the server is
    back, ``hold`` steps down after exactly the renew deadline, and campaigning again works.
    The missing namespace is created on the way."""
    clock = FakeClock(start=1000.0)
    async with serve_app(lease_api()) as base:
        port = int(base.rsplit(":", 1)[1])
        async with Relay(port) as relay:
            relayed = f"http://127.0.0.1:{relay.port}"
            async with KubeClient(auth=ClientAuth(server=relayed)) as client:
                elector = LeaderElector(
                    client=client, base=f"{relayed}/clusters/root:down", namespace="syncers",
                    name="vw", identity="a", clock=clock, lease_duration=15, renew_deadline=10,
                    retry_period=2, rand=lambda: 1.0,
                )  # fmt: skip
                acquiring = asyncio.create_task(elector.acquire())
                async with asyncio.timeout(10):
                    while True:  # six attempts failed and waited for
                        if len(clock.sleeps) >= 6:
                            break
                        await asyncio.sleep(0.01)
                assert not acquiring.done()  # retrying, not raised
                assert elector.last_error is not None and not elector.reachable
                relay.up()
                await asyncio.wait_for(acquiring, 10)
                assert elector.is_leader and elector.last_error is None
                assert clock.sleeps[:6] == [2, 4, 8, 16, 30, 30]

                relay.down()
                started = clock.monotonic()
                await asyncio.wait_for(elector.hold(), 10)
                assert not elector.is_leader
                assert clock.monotonic() - started == 10  # the renew deadline, on fake time
                relay.up()
                await asyncio.wait_for(elector.acquire(), 10)  # still our lease: renewed at once
                assert elector.is_leader and elector.holder == "a"
