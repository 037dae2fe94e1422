"""Watchers in a process of their own: many raw watch connections that are cheap to read.

Delivery latency measured inside the server's process, or in a process running a thousand
aiohttp clients, mostly measures the measuring: on two cores every client coroutine competes
with the server for CPU. Here each watch is an asyncio Protocol (on uvloop) whose
``data_received`` only stamps the time and keeps the bytes; the lines are found after the run.
Times are ``time.monotonic()`` (CLOCK_MONOTONIC on Linux, one clock for every process), so they
compare with the writer's.

Commands on stdin, one per line; answers on stdout:

    open GROUP COUNT  COUNT more watches of GROUP's URL, each through its initial events
                      (the ``k8s.io/initial-events-end`` bookmark) → ``opened GROUP TOTAL``
    record            keep (time, bytes) of all that arrives from now on → ``recording``
    collect           → one JSON line {GROUP: {NAME: [arrival times]}} for every object whose
                      name starts with --prefix, one time per watch that received it

End of input closes every watch.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import re
import ssl
import sys
import time
from pathlib import Path
from typing import cast

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rawhttp import address, get_request, status_of

INITIAL_END = b"initial-events-end"
OPEN_AT_ONCE = 64


class Watch(asyncio.Protocol):
    def __init__(self, request: bytes, established: asyncio.Future[None]) -> None:
        self.request = request
        self.established = established
        self.buffer = bytearray()
        self.scanned = 0
        self.recording = False
        self.received: list[tuple[float, bytes]] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        if self.recording:
            self.received.append((time.monotonic(), data))
            return
        if self.established.done():
            return  # bookmarks between establishment and recording
        self.buffer += data
        if not self.scanned and b"\r\n" in self.buffer and status_of(bytes(self.buffer)) != 200:
            self.established.set_exception(
                ConnectionError(bytes(self.buffer[:300]).decode(errors="replace"))
            )
            return
        if self.buffer.find(INITIAL_END, max(0, self.scanned - len(INITIAL_END))) >= 0:
            self.established.set_result(None)
            self.buffer = bytearray()
        else:
            self.scanned = len(self.buffer)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.established.done():
            self.established.set_exception(exc or ConnectionError("closed before established"))

    def arrivals(self, pattern: re.Pattern[bytes]) -> dict[str, float]:
        """When each matching object's line was complete (its newline had arrived)."""
        raw = b"".join(data for _, data in self.received)
        ends, end = [], 0
        for _, data in self.received:
            end += len(data)
            ends.append(end)
        found: dict[str, float] = {}
        for match in pattern.finditer(raw):
            newline = raw.find(b"\n", match.end())
            if newline < 0:
                continue  # the line never completed
            found.setdefault(
                match.group(1).decode(), self.received[bisect.bisect_right(ends, newline)][0]
            )
        return found


class Watchers:
    def __init__(self, groups: dict[str, str], *, token: str, ca: str | None) -> None:
        self.groups = groups
        self.token = token
        self.ssl = ssl.create_default_context(cafile=ca) if ca else None
        self.watches: dict[str, list[Watch]] = {name: [] for name in groups}

    async def open(self, group: str, count: int) -> int:
        url = self.groups[group]
        host, port, tls = address(url)
        request = get_request(url, token=self.token)
        gate = asyncio.Semaphore(OPEN_AT_ONCE)
        loop = asyncio.get_running_loop()

        async def one() -> Watch:
            async with gate:
                established: asyncio.Future[None] = loop.create_future()
                _, watch = await loop.create_connection(
                    lambda: Watch(request, established), host, port, ssl=self.ssl if tls else None
                )
                await asyncio.wait_for(established, 120)
                return watch

        self.watches[group] += await asyncio.gather(*(one() for _ in range(count)))
        return len(self.watches[group])

    def record(self) -> None:
        for watches in self.watches.values():
            for watch in watches:
                watch.recording = True

    def collect(self, prefix: str) -> dict[str, dict[str, list[float]]]:
        pattern = re.compile(rb'"name":"(' + re.escape(prefix.encode()) + rb'[^"]*)"')
        out: dict[str, dict[str, list[float]]] = {}
        for group, watches in self.watches.items():
            by_name: dict[str, list[float]] = {}
            for watch in watches:
                for name, at in watch.arrivals(pattern).items():
                    by_name.setdefault(name, []).append(at)
            out[group] = by_name
        return out

    def close(self) -> None:
        for watches in self.watches.values():
            for watch in watches:
                if watch.transport is not None:
                    watch.transport.abort()


async def serve(watchers: Watchers, *, prefix: str) -> None:
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    try:
        while line := (await stdin.readline()).decode().split():
            if line[0] == "open":
                total = await watchers.open(line[1], int(line[2]))
                print(f"opened {line[1]} {total}", flush=True)
            elif line[0] == "record":
                watchers.record()
                print("recording", flush=True)
            elif line[0] == "collect":
                print(json.dumps(watchers.collect(prefix)), flush=True)
            else:
                raise ValueError(f"unknown command {line!r}")
    finally:
        watchers.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", action="append", required=True, metavar="NAME=URL")
    parser.add_argument("--token", required=True)
    parser.add_argument("--ca", help="CA file for https URLs")
    parser.add_argument("--prefix", default="fanout-", help="names whose arrival is collected")
    args = parser.parse_args()
    groups = dict(g.split("=", 1) for g in args.group)
    uvloop.run(serve(Watchers(groups, token=args.token, ca=args.ca), prefix=args.prefix))


if __name__ == "__main__":
    main()
