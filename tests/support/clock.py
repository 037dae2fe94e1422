"""Fake clocks (:class:`vwserver.clock.Clock`) for tests.

Backoff, lease expiry, queue delays and resync logic take a Clock. With :class:`FakeClock`
sleeping advances time at once: a test that needs 15 s of lease time runs in milliseconds, and
can assert the exact delays that were asked for. With :class:`ManualClock` time stands still
until the test advances it, to check what happens before and after a moment.
"""

from __future__ import annotations

import asyncio
import heapq
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


class ManualClock:
    """A :class:`vwserver.clock.Clock` whose time moves only when the test says so.

    ``sleep`` waits until :meth:`advance` has moved the time past its deadline; sleepers wake in
    deadline order, each seeing the time it asked for. For checking *when* something happens
    (a resync after exactly 30 s, a retry not before its backoff), where :class:`FakeClock`'s
    instant sleeps would run everything at once.
    """

    def __init__(self, *, start: float = 0.0) -> None:
        self.t = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = 0

    def monotonic(self) -> float:
        return self.t

    def now(self) -> datetime:
        return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=self.t)

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future = asyncio.get_running_loop().create_future()
        self._order += 1
        heapq.heappush(self._sleepers, (self.t + seconds, self._order, future))
        await future

    @property
    def deadlines(self) -> list[float]:
        """When the current sleepers wake, earliest first."""
        return sorted(d for d, _, f in self._sleepers if not f.done())

    async def advance(self, seconds: float) -> None:
        """Move the time on by ``seconds``, waking every sleeper due meanwhile (and letting
        what they start run) in deadline order."""
        target = self.t + seconds
        await settle()
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline, _, future = heapq.heappop(self._sleepers)
            if future.done():
                continue  # cancelled
            self.t = max(self.t, deadline)
            future.set_result(None)
            await settle()
        self.t = target
        await settle()


async def settle(rounds: int = 20) -> None:
    """Let every task that can run without time passing run (a few event-loop iterations)."""
    for _ in range(rounds):
        await asyncio.sleep(0)
