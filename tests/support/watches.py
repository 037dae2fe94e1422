"""A watch read in the background, every event kept in arrival order.

The kcp tests compare what different watchers saw (kcp itself, and the slices in front of it)
after the fact: who saw which object at which resourceVersion, and in which order. A
:class:`Recorder` starts its watch at the resourceVersion of a LIST made just before, so that
nothing between the two is lost, and keeps the LIST's items as the state it started from.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import aiohttp

T = TypeVar("T")

Event = dict[str, Any]
"""A watch event as the server sent it: ``{"type": ..., "object": {...}}``."""


class Recorder:
    """One watch of ``url`` (a collection) from the resourceVersion of a LIST made first."""

    def __init__(self, session: aiohttp.ClientSession, url: str, params: dict[str, str]) -> None:
        self.session = session
        self.url = url
        self.params = params
        self.initial: list[dict[str, Any]] = []
        """The LIST's items the watch starts from."""
        self.events: list[Event] = []
        self.ended: str | None = None
        """Why the watch ended (None while it runs)."""
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self, *, from_list: bool = True) -> None:
        """``from_list``: LIST first and watch from its resourceVersion; else watch from now
        (no resourceVersion: the initial state arrives as ADDED events) — for URLs that only
        watch, such as the deprecated ``/watch/`` paths."""
        if not from_list:
            self._task = asyncio.create_task(self._read(""), name=f"watch {self.url}")
            return
        # resourceVersion=0, as informers list: served from the server's watch cache, and the
        # watch then starts at a version that cache has (a version newer than what it has
        # would have to wait for it)
        params = {**self.params, "resourceVersion": "0"}
        async with self.session.get(self.url, params=params) as resp:
            body = await resp.text()
            assert resp.status == 200, f"LIST {self.url}: {resp.status} {body}"
        listing = json.loads(body)
        self.initial = listing.get("items") or []
        since = listing["metadata"]["resourceVersion"]
        self._task = asyncio.create_task(self._read(since), name=f"watch {self.url}")

    async def _read(self, since: str) -> None:
        params = {
            **self.params,
            "watch": "true",
            "resourceVersion": since,
            "allowWatchBookmarks": "true",
            # kcp (and the proxy) end the stream by themselves even if a test forgets to
            "timeoutSeconds": "600",
        }
        if not since:
            del params["resourceVersion"]
        try:
            async with self.session.get(
                self.url, params=params, timeout=aiohttp.ClientTimeout(total=None)
            ) as resp:
                if resp.status != 200:
                    self.ended = f"WATCH {self.url}: {resp.status} {await resp.text()}"
                    return
                async for line in resp.content:
                    event: Event = json.loads(line)
                    if event.get("type") != "BOOKMARK":
                        self.events.append(event)
                    self._changed.set()
            self.ended = "the server ended the watch"
        except aiohttp.ClientError as e:
            self.ended = f"WATCH {self.url}: {e!r}"
        finally:
            self._changed.set()

    def of(self, name: str) -> list[Event]:
        """The events about the object named ``name``."""
        return [e for e in self.events if e["object"]["metadata"].get("name") == name]

    def reached(self, rv: int, *, name: str | None = None) -> bool:
        """Whether an event at resourceVersion ``rv`` or later arrived (about ``name``)."""
        events = self.events if name is None else self.of(name)
        return any(int(e["object"]["metadata"]["resourceVersion"]) >= rv for e in events)

    async def wait_for(self, what: str, probe: Callable[[], T | None], *, within: float) -> T:
        """``probe()`` once it is not None (checked after every event); fails after ``within``
        seconds or when the watch ends."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            value = probe()
            if value is not None:
                return value
            if self.ended is not None:
                raise AssertionError(f"{what}: the watch ended: {self.ended}")
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"timed out after {within:.0f}s waiting for {what}")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


@contextlib.asynccontextmanager
async def recording(
    session: aiohttp.ClientSession, url: str, *, from_list: bool = True, **params: str
) -> AsyncIterator[Recorder]:
    """A :class:`Recorder` of ``url`` (``params``: e.g. ``labelSelector``; ``from_list``: see
    :meth:`Recorder.start`), stopped when the block ends."""
    recorder = Recorder(session, url, params)
    await recorder.start(from_list=from_list)
    try:
        yield recorder
    finally:
        await recorder.stop()
