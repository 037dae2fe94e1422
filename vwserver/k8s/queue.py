"""The work queue of every control loop: deduplicating, per-key serialized, rate limited.

client-go's workqueue guarantees, for asyncio workers, timed by an injected
:class:`~vwserver.clock.Clock`:

* **Dedupe.** A key is queued at most once, however often it is added (events coalesce).
* **Per-key serialization.** A key is never handed to two workers at once: added while being
  processed, it is queued again when its worker calls :meth:`WorkQueue.done`.
* **Delayed adds.** :meth:`WorkQueue.add_after` queues a key later (a resync, a wait); of two
  pending delays for one key the earlier wins.
* **Per-key backoff.** :meth:`WorkQueue.add_rate_limited` re-adds a failed key after its
  :class:`~vwserver.k8s.backoff.Backoff` for the key's consecutive failures;
  :meth:`WorkQueue.forget` resets the count after a success.
* **Overall rate limit.** Those retries also draw from one token bucket (``rate`` per second,
  ``burst`` at once): when many keys fail together, their retries are spread out rather than
  hammering the server that just failed them.
* **Fairness (optional).** With ``group`` (a key's tenant, e.g. the slice's workspace) the queue
  hands out keys round-robin across groups, at most ``max_active_per_group`` of one group at a
  time, and each group's retries draw from a bucket of its own: a thousand keys of one group
  delay another group's key by at most one key per group ahead of it, never by the thousand,
  and one group's failures never spend another's retry budget. Without it: one group, FIFO.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

from vwserver.clock import Clock
from vwserver.k8s.backoff import Backoff

K = TypeVar("K", bound=Hashable)


class QueueShutDown(Exception):
    """The queue was shut down; workers stop. (The queue's end, like StopAsyncIteration, not an
    error: outside :mod:`vwserver.errors`' hierarchy.)"""


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up; a reservation may go into debt, and
    then says how long until its token exists (golang.org/x/time/rate's ``Reserve``)."""

    def __init__(self, *, rate: float, burst: int, clock: Clock) -> None:
        self._rate = rate
        self._burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock.monotonic()

    def reserve(self) -> float:
        """Take one token; the seconds until it is really available (0: now)."""
        now = self._clock.monotonic()
        self._tokens = min(float(self._burst), self._tokens + (now - self._at) * self._rate)
        self._at = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self._rate

    def take(self) -> float:
        """Take one token if one is there (0), else take none and say how many seconds until
        one is (never goes into debt: a caller that is told to wait costs nothing meanwhile)."""
        now = self._clock.monotonic()
        self._tokens = min(float(self._burst), self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self._rate


class WorkQueue(Generic[K]):
    def __init__(
        self,
        *,
        clock: Clock,
        backoff: Backoff | None = None,
        rate: float = 10.0,
        burst: int = 100,
        group: Callable[[K], Hashable] | None = None,
        max_active_per_group: int | None = None,
    ) -> None:
        self._clock = clock
        self._backoff = backoff or Backoff(initial=0.5, maximum=60.0, jitter=0.0)
        self._rate = rate
        self._burst = burst
        self._group: Callable[[K], Hashable] = group or _one_group
        self._max_active = max_active_per_group
        self._buckets: dict[Hashable, TokenBucket] = {}
        # queued keys per group, and the groups that have any in round-robin order
        self._queues: dict[Hashable, deque[K]] = {}
        self._ring: deque[Hashable] = deque()
        self._queued = 0
        self._active: dict[Hashable, int] = {}
        self._dirty: set[K] = set()
        self._processing: dict[K, Hashable] = {}
        """Keys being processed, with the group each was handed out as."""
        self._failures: dict[K, int] = {}
        self._wakeup = asyncio.Event()
        self._shut_down = False
        # delayed adds: when each waiting key is due, a heap of (due, tie-breaker, key) with
        # superseded entries left in it, and one task that sleeps until the earliest is due
        self._waiting: dict[K, float] = {}
        self._heap: list[tuple[float, int, K]] = []
        self._order = itertools.count()
        self._timer: asyncio.Task[None] | None = None
        self._timer_due = math.inf
        self._rearm = asyncio.Event()

    def __len__(self) -> int:
        """Keys queued now (not those being processed or waiting for a delay)."""
        return self._queued

    def queued(self, group: Hashable) -> int:
        """Keys of ``group`` queued now."""
        return len(self._queues.get(group, ()))

    def add(self, key: K) -> None:
        if self._shut_down or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._push(key)

    def _push(self, key: K) -> None:
        group = self._group(key)
        queue = self._queues.get(group)
        if queue is None:
            queue = self._queues[group] = deque()
            self._ring.append(group)
        queue.append(key)
        self._queued += 1
        self._wakeup.set()

    def _pop(self, accept: Callable[[Any], bool] | None) -> K | None:
        """The next key round-robin over the groups that ``accept`` admits and that are below
        their limit of keys in processing; None if there is none."""
        for _ in range(len(self._ring)):
            group = self._ring[0]
            self._ring.rotate(-1)  # this group's turn is over either way
            if accept is not None and not accept(group):
                continue
            if self._max_active is not None and self._active.get(group, 0) >= self._max_active:
                continue
            queue = self._queues[group]
            key = queue.popleft()
            self._queued -= 1
            if not queue:
                del self._queues[group]
                self._ring.pop()  # rotated to the end above
            self._active[group] = self._active.get(group, 0) + 1
            self._processing[key] = group
            self._dirty.discard(key)
            return key
        return None

    def add_after(self, key: K, delay: float) -> None:
        """Add ``key`` after ``delay`` seconds (an earlier pending delay for it wins)."""
        if self._shut_down:
            return
        if delay <= 0:
            self.add(key)
            return
        due = self._clock.monotonic() + delay
        pending = self._waiting.get(key)
        if pending is not None and pending <= due:
            return
        self._waiting[key] = due
        heapq.heappush(self._heap, (due, next(self._order), key))
        if self._timer is None or self._timer.done():
            self._timer = asyncio.get_running_loop().create_task(
                self._run_timer(), name="work queue timer"
            )
        elif due < self._timer_due:
            self._rearm.set()

    def add_rate_limited(self, key: K, *, backoff: Backoff | None = None) -> float:
        """Add a key whose processing failed after its backoff (and the overall rate limit);
        the delay chosen. ``backoff``: another curve for this failure (e.g. a long one for an
        error no retry can fix), counted on the same consecutive failures."""
        failures = self._failures[key] = self._failures.get(key, 0) + 1
        curve = backoff or self._backoff
        delay = max(curve.delay(failures), self.bucket(self._group(key)).reserve())
        self.add_after(key, delay)
        return delay

    def backing_off(self, key: K) -> bool:
        """Whether ``key`` failed and waits for its retry: a periodic re-add (a resync) that
        queued it now would cut the backoff short (:meth:`add` still does, for a real change)."""
        return key in self._failures and key in self._waiting

    def bucket(self, group: Hashable) -> TokenBucket:
        """The retry budget of ``group`` (the queue's one bucket without ``group``)."""
        bucket = self._buckets.get(group)
        if bucket is None:
            bucket = self._buckets[group] = TokenBucket(
                rate=self._rate, burst=self._burst, clock=self._clock
            )
        return bucket

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: K) -> None:
        """The key was processed successfully: its next failure starts the backoff anew."""
        self._failures.pop(key, None)

    async def get(self, *, accept: Callable[[Any], bool] | None = None) -> K:
        """The next key to process (call :meth:`done` after); raises QueueShutDown.
        ``accept``: only keys of the groups it admits (a worker reserved for some groups)."""
        while (key := self._pop(accept)) is None:
            if self._shut_down:
                raise QueueShutDown
            self._wakeup.clear()
            await self._wakeup.wait()
        return key

    def done(self, key: K) -> None:
        group = self._processing.pop(key, None)
        if group is not None:
            active = self._active[group] - 1
            if active:
                self._active[group] = active
            else:
                del self._active[group]
        if key in self._dirty:
            self._push(key)
        self._wakeup.set()  # a slot of the key's group is free again

    async def work(
        self,
        handle: Callable[[K], Awaitable[None]],
        *,
        accept: Callable[[Any], bool] | None = None,
    ) -> None:
        """One worker: ``handle`` each key it gets, marking it done afterwards (also when
        ``handle`` raises, which ends the worker), until the queue shuts down. Run several for
        concurrency; one key is still never handled twice at once. ``accept``: as for
        :meth:`get`."""
        while True:
            try:
                key = await self.get(accept=accept)
            except QueueShutDown:
                return
            try:
                await handle(key)
            finally:
                self.done(key)

    def shutdown(self) -> None:
        """Stop: pending delays are dropped, and :meth:`get` raises once the queue is empty."""
        self._shut_down = True
        if self._timer is not None:
            self._timer.cancel()
        self._waiting.clear()
        self._heap.clear()
        self._wakeup.set()

    async def _run_timer(self) -> None:
        while self._heap:
            due, _, key = self._heap[0]
            if self._waiting.get(key) != due:
                heapq.heappop(self._heap)  # superseded by an earlier delay, or already added
                continue
            wait = due - self._clock.monotonic()
            if wait <= 0:
                heapq.heappop(self._heap)
                del self._waiting[key]
                self.add(key)
                continue
            self._timer_due = due
            self._rearm.clear()
            sleep = asyncio.ensure_future(self._clock.sleep(wait))
            rearm = asyncio.ensure_future(self._rearm.wait())
            try:
                await asyncio.wait((sleep, rearm), return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleep.cancel()
                rearm.cancel()
        self._timer_due = math.inf


def _one_group(key: object) -> Hashable:
    return None
