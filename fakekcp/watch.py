"""The streaming half of a WATCH against the fake upstream.

A watch response is newline-delimited JSON events written as they happen. :class:`WatchStream`
owns one response: it sends the initial state (watch-list) or the replayed history, then drains
its :class:`~fakekcp.store.Watcher` queue, converting each stored event for this
watcher's selectors exactly like the watch cache does, interleaving BOOKMARKs, and applying the
mid-stream faults.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Protocol

from aiohttp import web

from fakekcp import render
from fakekcp.render import Output
from fakekcp.requests import ListOptions, UpstreamSettings
from fakekcp.store import (
    JSON,
    Event,
    Key,
    ResourceSpec,
    Store,
    StoredObject,
    Watcher,
    partial_metadata,
)


class WatchHost(Protocol):
    """What a watch stream reads from the handlers that started it."""

    fake: UpstreamSettings
    store: Store
    closing: bool


class WatchStream:
    """Writes one watch response: initial events or replay, then live events and bookmarks."""

    def __init__(
        self,
        handlers: WatchHost,
        request: web.Request,
        response: web.StreamResponse,
        spec: ResourceSpec,
        output: Output,
        include: str,
        match: Callable[[Key, StoredObject], bool],
    ) -> None:
        self.handlers = handlers
        self.request = request
        self.response = response
        self.spec = spec
        self.output = output
        self.include = include
        self.match = match
        self.sent = 0
        # Nothing at or below this resourceVersion may be sent (a watch from a future RV).
        self.after_rv = 0
        self.headers_sent = False
        self.done = False

    def _render(self, type_: str, obj: JSON, raw: bytes | None) -> bytes:
        output = self.output
        if output.kind == "PartialObjectMetadata":
            return render.event_line(type_, partial_metadata(obj, output.api_version))
        if output.kind == "Table":
            # On a watch only the first event's Table carries the column definitions.
            table = render.single_table(
                self.spec, obj, raw, output, self.include, headers=not self.headers_sent
            )
            self.headers_sent = True
            return render.event_line(type_, table)
        # PartialObjectMetadataList cannot be applied to one object: the apiserver logs the
        # failure and sends the object unchanged (watchEmbeddedEncoder.doEncode).
        return render.event_line(type_, raw if raw is not None else render.as_json(obj))

    def _bookmark(self, rv: int, *, initial_events_end: bool) -> bytes:
        if self.output.kind != "Table":
            return render.bookmark_line(self.spec, rv, initial_events_end=initial_events_end)
        # In a Table watch a bookmark is a Table too (and may be the first event: with columns).
        line = render.table_bookmark(
            self.spec,
            rv,
            self.output,
            self.include,
            initial_events_end=initial_events_end,
            headers=not self.headers_sent,
        )
        self.headers_sent = True
        return line

    def convert(self, event: Event) -> bytes | None:
        """cacheWatcher.convertToWatchEvent: selector transitions become ADDED / DELETED."""
        if event.rv <= self.after_rv:
            return None
        current = event.new is not None and self.match(event.key, event.new)
        previous = event.prev is not None and self.match(event.key, event.prev)
        if current and event.new is not None:
            return self._render("MODIFIED" if previous else "ADDED", event.new.obj, event.new.raw)
        if previous:
            return self._render("DELETED", event.gone_obj(), event.gone_raw())
        return None

    async def write(self, lines: list[bytes], *, counted: bool = True) -> None:
        faults = self.handlers.fake.faults
        if faults.garbage:
            await self.response.write(b'{"type":"ADDED","object":{"this is not json\n')
            self.done = True
            return
        limit = faults.die_mid_watch_after
        if counted and limit is not None and self.sent + len(lines) >= limit:
            await self.response.write(b"".join(lines[: max(0, limit - self.sent)]))
            if self.request.transport is not None:
                # Close without the terminating chunk: the client sees a broken stream, but
                # what was written before still arrives (abort() could drop it).
                self.request.transport.close()
            self.done = True
            return
        if lines:
            await self.response.write(b"".join(lines))
        if counted:
            self.sent += len(lines)

    async def run(
        self,
        watcher: Watcher,
        initial: list[StoredObject],
        replay: list[Event],
        opts: ListOptions,
        start_rv: int,
    ) -> None:
        store = self.handlers.store
        self.after_rv = start_rv
        batch: list[bytes] = []
        for stored in initial:
            batch.append(self._render("ADDED", stored.obj, stored.raw))
            if len(batch) >= 1000:
                await self.write(batch)
                batch = []
                if self.done:
                    return
        for event in replay:
            line = self.convert(event)
            if line is not None:
                batch.append(line)
        await self.write(batch)
        if self.done:
            return
        if opts.initial_events and opts.bookmarks:
            await self.write([self._bookmark(start_rv, initial_events_end=True)], counted=False)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + opts.timeout if opts.timeout else None
        interval = self.handlers.fake.bookmark_interval
        next_bookmark = loop.time() + interval if opts.bookmarks else None
        while not self.done and not watcher.closed and not self.handlers.closing:
            if watcher.pending:
                events, watcher.pending = watcher.pending, []
                lines = [line for line in map(self.convert, events) if line is not None]
                await self.write(lines)
                continue
            now = loop.time()
            if next_bookmark is not None and now >= next_bookmark:
                # Everything up to store.rv has been delivered or filtered out.
                await self.write(
                    [self._bookmark(max(store.rv, self.after_rv), initial_events_end=False)],
                    counted=False,
                )
                next_bookmark = now + interval
                continue
            if deadline is not None and now >= deadline:
                return
            transport = self.request.transport
            if transport is None or transport.is_closing():
                return
            # Wake up at least once a second to notice a client that went away.
            wait = 1.0
            for moment in (next_bookmark, deadline):
                if moment is not None:
                    wait = min(wait, moment - now)
            watcher.wakeup.clear()
            if watcher.pending:
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await watcher.wakeup.wait()
