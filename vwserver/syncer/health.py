"""The syncer's health server: :mod:`vwserver.health`'s endpoints plus ``/debug/stuck``.

* ``/healthz``, ``/livez``: the process serves (liveness).
* ``/readyz``: 200 when this replica is a standby (not the leader: nothing to sync; the body
  says ``standby: waiting for the lease … held by …``) or when it leads and every informer has
  completed its first list; otherwise 503 with one line per reason (``not ready: downstream
  unreachable: …``, ``not ready: upstream mongodbcommunity... not synced (403 Forbidden: ...)``).
  The Go filtered VW reported ready before its informers had synced; we do not.
* ``/metrics``: Prometheus text format from the syncer's own registry.
* ``/debug/stuck``: JSON list of objects that left the view holding our finalizer.
"""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from vwserver import health


class SyncerState(Protocol):
    def readiness(self) -> list[str]:
        """Why the syncer is not ready; empty when it is."""
        ...

    def readiness_notes(self) -> list[str]:
        """What a ready syncer is doing, for the body of ``/readyz`` (e.g. standing by)."""
        ...

    def metrics_text(self) -> bytes: ...

    def stuck_objects(self) -> list[dict[str, str]]: ...


def health_app(state: SyncerState) -> web.Application:
    async def stuck(_: web.Request) -> web.Response:
        return web.json_response(state.stuck_objects())

    app = health.health_app(
        problems=state.readiness, metrics=state.metrics_text, notes=state.readiness_notes
    )
    app.router.add_get("/debug/stuck", stuck)
    return app
