"""``/healthz``, ``/readyz``, ``/metrics`` and ``/debug/stuck`` of the syncer (a small aiohttp app).

* ``/healthz``: the process serves (liveness).
* ``/readyz``: 200 when this replica is a standby (not the leader: nothing to sync) or when it
  leads and every informer has completed its first list; otherwise 503 with one line per reason
  (e.g. ``upstream mongodbcommunity... not synced (403 Forbidden: ...)``). The Go filtered VW
  reported ready before its informers had synced; we do not.
* ``/metrics``: Prometheus text format from the syncer's own registry.
* ``/debug/stuck``: JSON list of objects that left the view holding our finalizer.
"""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from vwserver.syncer.metrics import CONTENT_TYPE


class SyncerState(Protocol):
    def readiness(self) -> list[str]:
        """Why the syncer is not ready; empty when it is."""
        ...

    def metrics_text(self) -> bytes: ...

    def stuck_objects(self) -> list[dict[str, str]]: ...


def health_app(state: SyncerState) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        problems = state.readiness()
        if problems:
            return web.Response(status=503, text="".join(f"{p}\n" for p in problems))
        return web.Response(text="ok\n")

    async def metrics(_: web.Request) -> web.Response:
        response = web.Response(body=state.metrics_text())
        response.headers["Content-Type"] = CONTENT_TYPE
        return response

    async def stuck(_: web.Request) -> web.Response:
        return web.json_response(state.stuck_objects())

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/livez", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/debug/stuck", stuck)
    return app
