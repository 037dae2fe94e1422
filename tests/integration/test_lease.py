"""Leader election against a small in-process Lease API with optimistic concurrency."""

from __future__ import annotations

import copy
from typing import Any

from aiohttp import web

from vwserver.controller.lease import LeaderElector
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.testing.serve import serve_app

PATH = "/clusters/{ws}/apis/coordination.k8s.io/v1/namespaces/default/leases"


def lease_api() -> web.Application:
    """GET/POST/PUT of Lease objects with resourceVersion conflicts, like the apiserver."""
    store: dict[str, dict[str, Any]] = {}
    rv = [0]

    def status(code: int, reason: str) -> web.Response:
        return web.json_response({"kind": "Status", "code": code, "reason": reason}, status=code)

    async def get(request: web.Request) -> web.Response:
        obj = store.get(request.match_info["name"])
        return web.json_response(obj) if obj else status(404, "NotFound")

    async def create(request: web.Request) -> web.Response:
        obj = await request.json()
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

    app = web.Application()
    app.router.add_get(PATH + "/{name}", get)
    app.router.add_post(PATH, create)
    app.router.add_put(PATH + "/{name}", update)
    return app


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_one_leader_and_takeover_after_expiry() -> None:
    clock = Clock()
    async with serve_app(lease_api()) as base, KubeClient(auth=ClientAuth(server=base)) as client:

        def elector(identity: str) -> LeaderElector:
            return LeaderElector(
                client=client, workspace="root:vw", name="vw", identity=identity,
                lease_seconds=15, clock=clock,
            )  # fmt: skip

        a, b = elector("a"), elector("b")
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()
        assert a.is_leader
        assert not b.is_leader
        clock.now += 5
        assert await a.try_acquire_or_renew()  # renewal
        assert not await b.try_acquire_or_renew()  # b observed a changed record: not expired
        clock.now += 14
        assert not await b.try_acquire_or_renew()  # 14 s since b saw a change: still a's
        assert a.is_leader  # a renewed 14 s ago, lease is 15 s
        clock.now += 2
        assert not a.is_leader  # a failed to renew in time: it stops writing status at once
        assert await b.try_acquire_or_renew()  # 16 s without change: b takes over
        assert b.is_leader
        assert not await a.try_acquire_or_renew()  # a sees b's fresh record
