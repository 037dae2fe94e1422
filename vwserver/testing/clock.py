"""A fake :class:`vwserver.clock.Clock` for tests: sleeping advances time at once.

Backoff, lease expiry and resync logic take a Clock; with this one a test that needs 15 s of
lease time runs in milliseconds, and can assert the exact delays that were asked for.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta


class FakeClock:
    def __init__(self, *, start: float = 0.0) -> None:
        self.t = start
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.t

    def now(self) -> datetime:
        return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=self.t)

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds
        await asyncio.sleep(0)  # still a real suspension point, like asyncio.sleep

    def advance(self, seconds: float) -> None:
        self.t += seconds
