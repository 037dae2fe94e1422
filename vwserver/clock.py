"""Time, injectable: the control loops' waits (backoff, queue delays, lease renewal, resync) all
go through a Clock.

Retry and leader-election logic is only trustworthy if it is tested, and tests cannot wait for
real 30-second backoffs or 15-second lease expiries (the backoff curve itself is
:class:`vwserver.k8s.backoff.Backoff`). Everything that sleeps or reads the
time takes a :class:`Clock`; production uses :class:`SystemClock`, tests a fake one that records the
requested sleeps and advances instantly.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for intervals and deadlines)."""
        ...

    def now(self) -> datetime:
        """Wall-clock time (for timestamps written into objects)."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def rfc3339(moment: datetime) -> str:
    """``metav1.Time``: seconds precision, UTC, ``Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(moment: datetime) -> str:
    """``metav1.MicroTime`` (Lease timestamps): microseconds, UTC, ``Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
