"""The slice controller reacts to its export appearing through watches, not polling.

A scripted stand-in for kcp serves exactly what the controller reads: vwserver's own endpoint
slice, one FilteredAPIExportEndpointSlice (whose watch stays silent), and the referenced APIExport
and its APIExportEndpointSlice, which "appear" when the test says so and announce themselves on
their watches. The controller re-checks a not-ready slice only after a minute, so if the slice is
served within seconds, the export's watch did it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from aiohttp import web

from vwserver.controller.controller import ControllerSettings, SliceController
from vwserver.controller.informer import Backoff
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.routes import Routes
from vwserver.testing.serve import serve_app

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


class FakeKcp:
    def __init__(self) -> None:
        self.base = ""
        self.export_exists = False
        self.appeared = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        eps = "/clusters/{ws}/apis/apis.kcp.io/v1alpha1/apiexportendpointslices"
        app.router.add_get(eps + "/{name}", self.endpoint_slice)
        app.router.add_get(eps, self.collection)
        app.router.add_get(
            "/clusters/{ws}/apis/apis.kcp.io/v1alpha2/apiexports/{name}", self.export
        )
        app.router.add_get("/clusters/{ws}/apis/apis.kcp.io/v1alpha2/apiexports", self.collection)
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
        obj = self._endpoint_slice(request.match_info["ws"], request.match_info["name"])
        return web.json_response(obj) if obj else web.json_response({"code": 404}, status=404)

    async def export(self, request: web.Request) -> web.Response:
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
        return web.json_response(SLICE)


async def test_slice_becomes_ready_when_its_export_appears() -> None:
    kcp = FakeKcp()
    routes = Routes()
    async with serve_app(kcp.app()) as base, KubeClient(auth=ClientAuth(server=base)) as client:
        kcp.base = base
        controller = SliceController(
            client=client,
            routes=routes,
            settings=ControllerSettings(
                export_path="root:vwserver",
                external_url="https://vw.example",
                resync=60.0,
                retry=Backoff(initial=60.0, maximum=60.0),  # no polling within this test
            ),
        )
        task = asyncio.create_task(controller.run())
        try:
            async with asyncio.timeout(5):
                while (route := routes.table.lookup("slicews", "prod")) is None:  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            assert route.not_ready is not None
            assert "not found" in route.not_ready
            kcp.export_exists = True
            kcp.appeared.set()
            async with asyncio.timeout(5):
                while (  # noqa: ASYNC110 - polling a plain attribute of the route table
                    route := routes.table.lookup("slicews", "prod")
                ) is None or route.not_ready:
                    await asyncio.sleep(0.02)
            assert route.upstream_url == f"{base}/services/apiexport/exportid/widgets.example.io"
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await controller.aclose()
