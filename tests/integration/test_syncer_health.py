"""The syncer's health app: /readyz names what is missing, /metrics is Prometheus text."""

from __future__ import annotations

import aiohttp

from tests.support.serve import serve_app
from vwserver.syncer.health import health_app
from vwserver.syncer.metrics import SyncerMetrics


class State:
    def __init__(self) -> None:
        self.problems = ["upstream x: not synced (403 Forbidden)"]
        self.metrics = SyncerMetrics()

    def readiness(self) -> list[str]:
        return self.problems

    def readiness_notes(self) -> list[str]:
        return [] if self.problems else ["standby: waiting for the lease ns/l held by other"]

    def metrics_text(self) -> bytes:
        return self.metrics.render()

    def stuck_objects(self) -> list[dict[str, str]]:
        return [{"name": "db"}]


async def test_endpoints() -> None:
    state = State()
    state.metrics.stuck_finalizers.labels("things.g").set(2)
    async with serve_app(health_app(state)) as base, aiohttp.ClientSession() as session:
        async with session.get(f"{base}/healthz") as resp:
            assert resp.status == 200
        async with session.get(f"{base}/readyz") as resp:
            assert resp.status == 503
            assert "403 Forbidden" in await resp.text()
        state.problems = []
        async with session.get(f"{base}/readyz") as resp:
            assert resp.status == 200
            assert await resp.text() == "ok\nstandby: waiting for the lease ns/l held by other"
        async with session.get(f"{base}/metrics") as resp:
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = await resp.text()
            assert 'vwserver_syncer_stuck_finalizers{resource="things.g"} 2.0' in text
        async with session.get(f"{base}/debug/stuck") as resp:
            assert await resp.json() == [{"name": "db"}]
