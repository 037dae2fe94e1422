"""A work queue with client-go's guarantees, for asyncio workers.

* A key is queued at most once, however often it is added (events coalesce).
* A key is never handed to two workers at once: added while being processed, it is queued again
  when its worker calls :meth:`WorkQueue.done` (per-key serialization).
* :meth:`WorkQueue.add_rate_limited` re-adds a failed key after an exponential per-key backoff
  (``base * 2**(failures-1)``, capped); :meth:`WorkQueue.forget` resets it after a success.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class QueueShutDown(Exception):
    """The queue was shut down; workers stop."""


def retry_delay(failures: int, *, base: float, maximum: float) -> float:
    """Delay before retry number ``failures`` (1-based)."""
    return float(min(base * 2 ** max(failures - 1, 0), maximum))


class WorkQueue(Generic[K]):
    def __init__(self, *, retry_base: float = 0.5, retry_max: float = 60.0) -> None:
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._failures: dict[K, int] = {}
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._wakeup = asyncio.Event()
        self._shut_down = False
        self._retry_base = retry_base
        self._retry_max = retry_max

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, key: K) -> None:
        if self._shut_down or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            self._wakeup.set()

    def add_after(self, key: K, delay: float) -> None:
        """Add ``key`` after ``delay`` seconds (an earlier pending timer for it wins)."""
        if self._shut_down:
            return
        if delay <= 0:
            self.add(key)
            return
        existing = self._timers.get(key)
        loop = asyncio.get_running_loop()
        if existing is not None:
            if existing.when() <= loop.time() + delay:
                return
            existing.cancel()
        self._timers[key] = loop.call_later(delay, self._fire, key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def add_rate_limited(self, key: K) -> float:
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = retry_delay(failures, base=self._retry_base, maximum=self._retry_max)
        self.add_after(key, delay)
        return delay

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    async def get(self) -> K:
        while not self._queue:
            if self._shut_down:
                raise QueueShutDown
            self._wakeup.clear()
            await self._wakeup.wait()
        key = self._queue.popleft()
        self._processing.add(key)
        self._dirty.discard(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.append(key)
            self._wakeup.set()

    def shutdown(self) -> None:
        self._shut_down = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._wakeup.set()
