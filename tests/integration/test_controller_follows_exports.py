"""The slice controller reacts to its export appearing through watches, not polling, and to its
export's owner granting and revoking consent at the next reconcile.

A scripted stand-in for kcp serves exactly what the controller reads: vwserver's own endpoint
slice, one FilteredAPIExportEndpointSlice in logical cluster ``slicews`` (whose watch stays
silent), the referenced APIExport in ``exportid`` and its APIExportEndpointSlice, which "appear"
when the test says so and announce themselves on their watches, and the consent review
(:class:`~fakekcp.auth.FakeAuth`), and the LogicalCluster of workspace ``root:provider`` (whose
ID is ``exportid``). In the first test the controller re-checks a
not-ready slice only after a minute, so if the slice is served within seconds, the export's watch
did it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from fakekcp.auth import FakeAuth
from tests.support.serve import serve_app
from vwserver.controller import consent
from vwserver.controller.slices import ControllerSettings, SliceController
from vwserver.k8s.backoff import Backoff
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.routes import Route, Routes

SLICE = {
    "apiVersion": "sync.edge-connect.eu/v1alpha1",
    "kind": "FilteredAPIExportEndpointSlice",
    "metadata": {
        "name": "prod",
        "generation": 1,
        "resourceVersion": "1",
        "annotations": {"kcp.io/cluster": "slicews"},
    },
    "spec": {
        "export": {"path": "root:provider", "name": "widgets.example.io"},
        "objectSelector": {"matchLabels": {"env": "prod"}},
    },
}


CONSENT = {
    "export_cluster": "exportid",
    "export_name": "widgets.example.io",
    "slice_cluster": "slicews",
}


class FakeKcp:
    def __init__(self) -> None:
        self.base = ""
        self.export_exists = False
        self.appeared = asyncio.Event()
        self.auth = FakeAuth()
        self.statuses: list[dict[str, Any]] = []
        self.unconsented_reads = 0
        """Reads and watches of the export made while its owner did not consent."""

    def app(self) -> web.Application:
        app = web.Application()
        self.auth.install(app)
        eps = "/clusters/{ws}/apis/apis.kcp.io/v1alpha1/apiexportendpointslices"
        app.router.add_get(eps + "/{name}", self.endpoint_slice)
        app.router.add_get(eps, self.collection)
        app.router.add_get(
            "/clusters/{ws}/apis/apis.kcp.io/v1alpha2/apiexports/{name}", self.export
        )
        app.router.add_get("/clusters/{ws}/apis/apis.kcp.io/v1alpha2/apiexports", self.collection)
        app.router.add_get(
            "/clusters/root:provider/apis/core.kcp.io/v1alpha1/logicalclusters/cluster",
            self.logical_cluster,
        )
        slices = "/vw/clusters/*/apis/sync.edge-connect.eu/v1alpha1/filteredapiexportendpointslices"
        app.router.add_get(slices, self.slices)
        app.router.add_patch(
            "/vw/clusters/slicews/apis/sync.edge-connect.eu/v1alpha1/"
            "filteredapiexportendpointslices/prod/status",
            self.status,
        )
        return app

    def _endpoint_slice(self, ws: str, name: str) -> dict[str, Any] | None:
        if name == "sync.edge-connect.eu":  # vwserver's own API: always there
            return {
                "metadata": {"name": name},
                "status": {"endpoints": [{"url": self.base + "/vw"}]},
            }
        if not self.export_exists:
            return None
        url = f"{self.base}/services/apiexport/exportid/{name}"
        return {
            "metadata": {"name": name, "resourceVersion": "5"},
            "status": {"endpoints": [{"url": url}]},
        }

    async def endpoint_slice(self, request: web.Request) -> web.Response:
        if request.match_info["name"] != "sync.edge-connect.eu":
            self._read(request.match_info["name"])
        obj = self._endpoint_slice(request.match_info["ws"], request.match_info["name"])
        return web.json_response(obj) if obj else web.json_response({"code": 404}, status=404)

    async def logical_cluster(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"metadata": {"name": "cluster", "annotations": {"kcp.io/cluster": "exportid"}}}
        )

    def _read(self, name: str) -> None:
        """Something of export ``name`` is read: count it if its owner does not consent."""
        review = consent.review(slice_cluster="slicews", export_name=name)
        if not self.auth._allowed("exportid", review["spec"]):
            self.unconsented_reads += 1

    async def export(self, request: web.Request) -> web.Response:
        self._read(request.match_info["name"])
        if not self.export_exists:
            return web.json_response({"code": 404, "reason": "NotFound"}, status=404)
        return web.json_response(
            {
                "metadata": {
                    "name": request.match_info["name"],
                    "annotations": {"kcp.io/cluster": "exportid"},
                }
            }
        )

    async def collection(self, request: web.Request) -> web.StreamResponse:
        """List (empty until the export appears) and watch (one ADDED when it appears)."""
        self._read("widgets.example.io")
        if request.query.get("watch") != "true":
            return web.json_response({"metadata": {"resourceVersion": "1"}, "items": []})
        response = web.StreamResponse()
        await response.prepare(request)
        await self.appeared.wait()
        event = {
            "type": "ADDED",
            "object": {"metadata": {"name": "widgets.example.io", "resourceVersion": "5"}},
        }
        await response.write(json.dumps(event).encode() + b"\n")
        await asyncio.sleep(3600)  # the watch stays open
        return response

    async def slices(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            return web.json_response({"metadata": {"resourceVersion": "1"}, "items": [SLICE]})
        response = web.StreamResponse()
        await response.prepare(request)
        await asyncio.sleep(3600)  # no slice event ever: only the export's watch can help
        return response

    async def status(self, request: web.Request) -> web.Response:
        self.statuses.append((await request.json())["status"])
        return web.json_response(SLICE)


@contextlib.asynccontextmanager
async def controlling(kcp: FakeKcp, *, resync: float, retry: Backoff) -> AsyncIterator[Routes]:
    """A running controller against ``kcp``; yields its route table."""
    routes = Routes()
    async with serve_app(kcp.app()) as base, KubeClient(auth=ClientAuth(server=base)) as client:
        kcp.base = base
        controller = SliceController(
            client=client,
            routes=routes,
            settings=ControllerSettings(
                export_path="root:vwserver",
                external_url="https://vw.example",
                resync=resync,
                retry=retry,
            ),
        )
        task = asyncio.create_task(controller.run())
        try:
            yield routes
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await controller.aclose()


async def served_route(routes: Routes, *, ready: bool, within: float = 5) -> Route:
    """The slice's route once it is (not) ready."""
    async with asyncio.timeout(within):
        while (  # noqa: ASYNC110 - polling a plain attribute of the route table
            route := routes.table.lookup("slicews", "prod")
        ) is None or (route.not_ready is None) != ready:
            await asyncio.sleep(0.02)
    return route


async def written_reasons(kcp: FakeKcp, *, ready: str, within: float = 5) -> dict[str, str]:
    """The condition reasons of the status written last, once its Ready reason is ``ready``
    (the route table changes before the status write reaches kcp)."""
    async with asyncio.timeout(within):
        while True:
            if kcp.statuses:
                reasons = {c["type"]: c["reason"] for c in kcp.statuses[-1]["conditions"]}
                if reasons.get("Ready") == ready:
                    return reasons
            await asyncio.sleep(0.02)


async def test_slice_becomes_ready_when_its_export_appears() -> None:
    kcp = FakeKcp()
    kcp.auth.consent(**CONSENT)
    # no polling within this test: resync and retries a minute away
    async with controlling(kcp, resync=60.0, retry=Backoff(initial=60.0, maximum=60.0)) as routes:
        route = await served_route(routes, ready=False)
        assert route.not_ready is not None
        assert "not found" in route.not_ready
        kcp.export_exists = True
        kcp.appeared.set()
        route = await served_route(routes, ready=True)
        assert route.upstream_url == f"{kcp.base}/services/apiexport/exportid/widgets.example.io"


async def test_consent_is_asked_on_every_reconcile_and_revocation_retires_the_route() -> None:
    """Refused → granted (served at the next retry) → revoked (503 at the next resync, the
    ready route retired so its watches end); nothing of the answer is cached."""
    kcp = FakeKcp()
    kcp.export_exists = True
    kcp.appeared.set()
    async with controlling(kcp, resync=0.3, retry=Backoff(initial=0.05, maximum=0.1)) as routes:
        refused = await served_route(routes, ready=False)
        assert refused.not_ready is not None
        assert "system:vwserver:workspace:slicews" in refused.not_ready
        assert refused.upstream_url == ""
        review = kcp.auth.access_reviews[-1]
        assert review["cluster"] == "exportid"  # asked in the export's logical cluster
        assert kcp.unconsented_reads == 0  # nothing of the export read before consent
        assert review["spec"]["user"] == "system:vwserver:workspace:slicews"
        reasons = await written_reasons(kcp, ready="NotPermitted")
        assert reasons == {
            "SelectorValid": "Valid",
            "APIExportValid": "NotPermitted",
            "Ready": "NotPermitted",
        }

        kcp.auth.consent(**CONSENT)
        ready = await served_route(routes, ready=True)
        assert not ready.retired.is_set()
        asked = len(kcp.auth.access_reviews)
        await asyncio.sleep(0.8)  # a ready slice is re-asked every resync
        assert len(kcp.auth.access_reviews) > asked
        assert routes.table.lookup("slicews", "prod") is ready  # unchanged: not retired

        kcp.auth.revoke_consent(**CONSENT)
        revoked = await served_route(routes, ready=False, within=2)
        assert ready.retired.is_set()  # open watches on the ready route end
        assert revoked.upstream_url == ""


async def test_a_ready_slice_fails_closed_when_consent_cannot_be_rechecked() -> None:
    """kcp stops answering the consent review: the ready route is not trusted beyond a resync;
    kcp refusing vwserver's review is NotPermitted in the status (as a denial: it must not tell
    whether the workspace exists) and the reason is in the route's 503 only as that answer."""
    kcp = FakeKcp()
    kcp.export_exists = True
    kcp.appeared.set()
    kcp.auth.consent(**CONSENT)
    async with controlling(kcp, resync=0.3, retry=Backoff(initial=0.05, maximum=0.1)) as routes:
        ready = await served_route(routes, ready=True)
        kcp.auth.fail_with = 503  # transient: the reconcile fails and is retried
        stale = await served_route(routes, ready=False, within=2)
        assert ready.retired.is_set()
        assert stale.not_ready is not None
        assert "cannot re-check" in stale.not_ready
        kcp.auth.fail_with = None
        await served_route(routes, ready=True, within=2)
        kcp.auth.fail_with = 403  # kcp refuses vwserver's review: no answer is no consent
        unknown = await served_route(routes, ready=False, within=2)
        assert unknown.not_ready is not None
        assert "system:vwserver:workspace:slicews" in unknown.not_ready
        reasons = await written_reasons(kcp, ready="NotPermitted")
        assert reasons["APIExportValid"] == "NotPermitted"
