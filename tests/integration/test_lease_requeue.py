"""A replica that becomes the Lease holder writes every slice's status at once.

Only the holder of the controller's Lease writes slice status (two replicas must not race on
it); every replica reconciles every change and serves. So while a replica stands by, slices are
created and reconciled without a status being written, and a ready slice is looked at again
only at its next resync (minutes). When the holder dies without releasing the Lease, whatever it
left unwritten (it may have died mid-way) must be written by the replica that takes over, as
soon as it holds the Lease — not a resync later.

vwserver's own APIExport virtual workspace is the fake one (fakekcp: the slices, their status
subresource, and the Lease with its conditional writes); kcp's APIs around it — vwserver's
APIExportEndpointSlice, and the APIExport each slice references with its endpoint slice — are
a few scripted routes. The controller and its elector run on a ManualClock with a resync and
retries an hour away: the only time that passes is the test's, for the dead holder's Lease to
expire.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from fakekcp.store import ResourceSpec
from fakekcp.upstream import FakeUpstream, start_fake_upstream
from tests.integration.test_cache_shared import until
from tests.support.clock import ManualClock
from tests.support.serve import serve_app
from vwserver.clock import micro_time
from vwserver.controller.slices import ControllerSettings, SliceController
from vwserver.k8s import kcp, resources
from vwserver.k8s.backoff import Backoff
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.k8s.lease import LeaderElector
from vwserver.routes import Routes

WAIT = 5.0
SLICE_CLUSTER = "slicews"
EXPORT = "widgets.example.io"
EXPORT_VW = f"https://shard.example/services/apiexport/{SLICE_CLUSTER}/{EXPORT}"
EXTERNAL_URL = "https://vw.example"
OWN_EXPORT_PATH = "root:vwserver"
LEASE_CLUSTER = "leasews"
LEASE_DURATION = 15.0
HOUR = 3600.0


def served_as(
    resource: resources.ResourceType, *, namespaced: bool = True, status_subresource: bool = True
) -> ResourceSpec:
    """The fake's description of ``resource``."""
    return ResourceSpec(
        group=resource.group,
        version=resource.version,
        plural=resource.resource,
        kind=resource.kind,
        namespaced=namespaced,
        status_subresource=status_subresource,
    )


SLICES = served_as(kcp.SLICES, namespaced=False)
LEASES = served_as(resources.LEASES, status_subresource=False)


def slice_object(name: str) -> dict[str, Any]:
    """A slice of the export in its own workspace (consent implied: no review asked)."""
    return {
        "apiVersion": kcp.SLICES.api_version,
        "kind": kcp.SLICES.kind,
        "metadata": {"name": name},
        "spec": {"export": {"name": EXPORT}, "objectSelector": {"matchLabels": {"env": name}}},
    }


class KcpApis:
    """kcp's part beside the virtual workspace: vwserver's own APIExportEndpointSlice (the
    fake's URL), and the slices' APIExport with its endpoint slice, read one by one and
    list+watched by name (their watches stay silent: nothing about them changes)."""

    def __init__(self, own_vw: str) -> None:
        self.own_vw = own_vw

    def app(self) -> web.Application:
        app = web.Application()
        for resource in (kcp.APIEXPORTS, kcp.APIEXPORT_ENDPOINT_SLICES):
            collection = resource.collection("/clusters/{ws}")
            app.router.add_get(collection + "/{name}", self.item)
            app.router.add_get(collection, self.collection)
        return app

    def _object(self, path: str, name: str) -> dict[str, Any] | None:
        meta = {"name": name, "resourceVersion": "5", "annotations": {}}
        if f"/{kcp.APIEXPORTS.resource}" in path:
            meta["annotations"] = {kcp.CLUSTER_ANNOTATION: SLICE_CLUSTER}
            return {"metadata": meta} if name == EXPORT else None
        urls = {kcp.SLICES.group: self.own_vw, EXPORT: EXPORT_VW}
        if name not in urls:
            return None
        return {"metadata": meta, "status": {"endpoints": [{"url": urls[name]}]}}

    async def item(self, request: web.Request) -> web.Response:
        obj = self._object(request.path, request.match_info["name"])
        if obj is None:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        return web.json_response(obj)

    async def collection(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            name = request.query.get("fieldSelector", "").removeprefix("metadata.name=")
            obj = self._object(request.path, name)
            items = [obj] if obj is not None else []
            return web.json_response({"metadata": {"resourceVersion": "5"}, "items": items})
        response = web.StreamResponse()
        await response.prepare(request)
        await asyncio.sleep(HOUR)
        return response


@dataclass
class Bed:
    fake: FakeUpstream
    routes: Routes
    elector: LeaderElector
    clock: ManualClock

    def status(self, name: str) -> dict[str, Any]:
        obj = self.fake.get(
            cluster=SLICE_CLUSTER, namespace="", name=name, resource=kcp.SLICES.resource
        )
        assert obj is not None, name
        return dict(obj.get("status") or {})

    def leading(self) -> bool:
        return self.elector.is_leader

    def served(self, name: str) -> bool:
        route = self.routes.table.lookup(SLICE_CLUSTER, name)
        return route is not None and route.not_ready is None


@contextlib.asynccontextmanager
async def standby(*, lease_holder: str) -> AsyncIterator[Bed]:
    """A controller whose Lease is held by ``lease_holder`` (renewed just now, never again)."""
    fake = FakeUpstream(
        export_cluster="vwexport", export_name=kcp.SLICES.group, resources=[SLICES, LEASES]
    )
    clock = ManualClock()
    now = micro_time(clock.now())
    fake.create(
        cluster=LEASE_CLUSTER,
        obj={
            "apiVersion": resources.LEASES.api_version,
            "kind": resources.LEASES.kind,
            "metadata": {"name": "vwserver", "namespace": "default"},
            "spec": {
                "holderIdentity": lease_holder,
                "leaseDurationSeconds": int(LEASE_DURATION),
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        },
    )
    routes = Routes()
    async with (
        start_fake_upstream(fake) as (_, vw_url),
        serve_app(KcpApis(vw_url).app()) as kcp_url,
        KubeClient(auth=ClientAuth(server=kcp_url)) as client,
    ):
        elector = LeaderElector(
            client=client,
            base=kcp.clusters(vw_url, LEASE_CLUSTER),
            namespace="default",
            name="vwserver",
            identity="standby",
            clock=clock,
            lease_duration=LEASE_DURATION,
            renew_deadline=10,
            retry_period=2,
            rand=lambda: 0.0,
        )
        controller = SliceController(
            client=client,
            routes=routes,
            settings=ControllerSettings(
                export_path=OWN_EXPORT_PATH,
                external_url=EXTERNAL_URL,
                resync=HOUR,
                retry=Backoff(initial=HOUR, maximum=HOUR),
            ),
            leader=elector,
            clock=clock,
        )
        task = asyncio.create_task(controller.run())
        try:
            yield Bed(fake, routes, elector, clock)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await controller.aclose()


async def test_the_new_lease_holder_writes_the_status_every_slice_is_missing() -> None:
    async with standby(lease_holder="replica-that-died") as bed:
        bed.fake.create(cluster=SLICE_CLUSTER, obj=slice_object("a"))
        bed.fake.create(cluster=SLICE_CLUSTER, obj=slice_object("b"))
        await until("a and b served", lambda: bed.served("a") and bed.served("b"))
        # a slice created while this replica stands by: reconciled and served too
        bed.fake.create(cluster=SLICE_CLUSTER, obj=slice_object("c"))
        await until("c served", lambda: bed.served("c"))
        assert not bed.leading()
        assert bed.elector.holder == "replica-that-died"
        assert [bed.status(n) for n in "abc"] == [{}, {}, {}]  # a standby writes none

        # The dead holder's record stands still: it may be taken after the lease duration
        # (on this replica's clock), at the elector's next attempt.
        async with asyncio.timeout(WAIT):
            while not bed.leading():
                await bed.clock.advance(1)
                await asyncio.sleep(0.01)
        assert LEASE_DURATION <= bed.clock.monotonic() < HOUR / 2  # no resync or retry yet

        def written() -> bool:
            return all(bed.status(n).get("endpoints") for n in "abc")

        await until("every slice's status written by the new holder", written)
        for name in "abc":
            status = bed.status(name)
            ready = {c["type"]: c["status"] for c in status["conditions"]}["Ready"]
            assert ready == "True", status
            url = f"{EXTERNAL_URL}{kcp.SLICE_ENDPOINT_PREFIX}/{SLICE_CLUSTER}/{name}"
            assert status["endpoints"] == [{"url": url}]
