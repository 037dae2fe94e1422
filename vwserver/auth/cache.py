"""A bounded TTL cache for review answers, with one review per key in flight.

Every request through a slice needs an authentication and an authorization answer; asking kcp
each time would double kcp's load and add two round trips to every request. Answers are therefore
cached, briefly and per answer (a grant may live minutes, a denial only seconds, so a fresh grant
takes effect quickly), with an injectable clock so TTL logic is tested without sleeping.

Bounded because the keys come from clients: a stream of random tokens must not grow memory.
The least recently used entry goes first. Concurrent misses for one key share a single load:
a controller that starts its informers sends a burst of requests with the same token, and that
burst should cost kcp one TokenReview, not one per request.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

Clock = Callable[[], float]
"""Seconds on a monotonic scale (``time.monotonic`` unless a test injects its own)."""


@dataclass(slots=True)
class _Entry(Generic[V]):
    value: V
    expires: float


class _LeaderCancelled(Exception):
    """The request that was loading a key was cancelled; a waiter loads it itself."""


class TTLCache(Generic[K, V]):
    """At most ``max_entries`` values, each valid for the TTL it was stored with."""

    def __init__(self, *, max_entries: int, clock: Clock = time.monotonic) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._max = max_entries
        self._clock = clock
        self._entries: OrderedDict[K, _Entry[V]] = OrderedDict()
        self._loading: dict[K, asyncio.Future[V]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[K]:
        """The stored keys, live or not yet dropped, least recently used first."""
        return list(self._entries)

    def get(self, key: K) -> V | None:
        """The live value for ``key``, or None (an expired entry is dropped on the way)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires <= self._clock():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry.value

    def put(self, key: K, value: V, *, ttl: float) -> None:
        """Store ``value`` for ``ttl`` seconds; a TTL of 0 or less stores nothing."""
        if ttl <= 0:
            self._entries.pop(key, None)
            return
        self._entries[key] = _Entry(value, self._clock() + ttl)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    async def get_or_load(self, key: K, load: Callable[[], Awaitable[tuple[V, float]]]) -> V:
        """The cached value, or the result of ``load()`` (``(value, ttl)``), stored for ``ttl``.

        While one caller loads a key, others asking for it wait for that result instead of
        loading again. A failed load is not cached: its waiters get the same exception.
        """
        while True:
            hit = self.get(key)
            if hit is not None:
                return hit
            pending = self._loading.get(key)
            if pending is None:
                break
            try:
                # shield: a waiter that is cancelled must not cancel the shared result.
                return await asyncio.shield(pending)
            except _LeaderCancelled:
                continue
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        try:
            value, ttl = await load()
        except asyncio.CancelledError:
            future.set_exception(_LeaderCancelled())
            raise
        except Exception as e:
            future.set_exception(e)
            raise
        else:
            self.put(key, value, ttl=ttl)
            future.set_result(value)
            return value
        finally:
            del self._loading[key]
            if future.done() and not future.cancelled():
                # Marks the exception as retrieved: nobody may have been waiting for it, and
                # asyncio would otherwise log "Future exception was never retrieved".
                future.exception()
