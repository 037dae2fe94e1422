"""The soak's watch clients: ``--clients`` TLS watches of one slice URL, in a process of their own.

Why a process of their own: vwserver's memory and file descriptors are read from ``/proc`` and
must be vwserver's alone, and a thousand client coroutines in the test's process would share an
event loop with the writer and with kcp's reference watch, whose timing the test relies on.
Times are ``time.monotonic()`` (CLOCK_MONOTONIC on Linux: one clock for every process), so they
compare with the test's.

    python -m tests.soak.watchers --url URL --ca CA_FILE --token-file FILE --clients N \\
        --label KEY=VALUE --timeout-seconds T

Each client watches ``URL?watch=1&resourceVersion=0&allowWatchBookmarks=true&timeoutSeconds=T``
with its own connection: the slice's current objects as ADDED events (none, when the test
starts them before it writes anything), then every change. Output, JSON lines on stdout (:mod:`tests.soak.deliveries` for the
change reports):

* ``{"kind": "ready", "clients": N, "seconds": S}`` once every watch has answered 200;
* ``{"kind": "refused", "client": I, "reason": ...}`` when a watch could not be opened (its
  client stops: the test fails on it);
* ``{"kind": "ended", ...}`` when an open watch ended; its client re-watches from the last
  resourceVersion it saw, as client-go does;
* deliveries and anomalies as they happen, and on end of stdin the final report; then exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import ssl
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import aiohttp
import msgspec

from tests.soak.deliveries import Deliveries, decode_event

OPEN_AT_ONCE: Final = 32
"""Watches being opened at the same time (TLS handshakes are the costly part)."""
OPEN_TIMEOUT: Final = 60.0
"""Seconds one watch may take from connecting to its response headers."""
REWATCH_DELAY: Final = 1.0
ANOMALIES_SHOWN: Final = 200
"""Anomaly lines written out; beyond that only counted (a leak to every client would be a flood)."""


class Output:
    """JSON lines on stdout, anomalies capped."""

    def __init__(self) -> None:
        self.anomalies = 0

    def emit(self, lines: Iterable[dict[str, Any]]) -> None:
        for line in lines:
            if line["kind"] == "anomaly":
                self.anomalies += 1
                if self.anomalies > ANOMALIES_SHOWN:
                    continue
            sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()


class Watchers:
    def __init__(self, args: argparse.Namespace, session: aiohttp.ClientSession) -> None:
        self.args = args
        self.session = session
        key, _, value = args.label.partition("=")
        self.deliveries = Deliveries(clients=args.clients, label=(key, value))
        self.out = Output()
        self.opening = asyncio.Semaphore(OPEN_AT_ONCE)
        self.opened = 0
        self.started = time.monotonic()

    async def client(self, i: int) -> None:
        """Client ``i``: watch until cancelled, re-watching whenever the watch ends."""
        rv = "0"
        first = True
        while True:
            params = {
                "watch": "1",
                "resourceVersion": rv,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(self.args.timeout_seconds),
            }
            try:
                async with self.opening, asyncio.timeout(OPEN_TIMEOUT):
                    response = await self.session.get(self.args.url, params=params)
            except (aiohttp.ClientError, TimeoutError) as e:
                if first:
                    self.out.emit([{"kind": "refused", "client": i, "reason": repr(e)}])
                    return
                reason = f"re-watch failed: {e!r}"
            else:
                async with response:
                    if response.status != 200:
                        body = (await response.text())[:300]
                        refused = {"kind": "refused", "client": i, "status": response.status}
                        self.out.emit([refused | {"reason": body}])
                        return
                    if first:
                        first = False
                        self._established()
                    reason = await self._read(i, response)
            self.out.emit(self.deliveries.ended(i, reason, at=time.monotonic()))
            rv = self.deliveries.resume_rv(i) or rv
            await asyncio.sleep(REWATCH_DELAY)

    def _established(self) -> None:
        self.opened += 1
        if self.opened == self.args.clients:
            seconds = round(time.monotonic() - self.started, 2)
            self.out.emit([{"kind": "ready", "clients": self.opened, "seconds": seconds}])

    async def _read(self, i: int, response: aiohttp.ClientResponse) -> str:
        """Every event of one watch response; why it ended."""
        try:
            async for line in response.content:
                if line.strip():
                    event = decode_event(line)
                    self.out.emit(self.deliveries.received(i, event, at=time.monotonic()))
        except (aiohttp.ClientError, msgspec.DecodeError, ValueError) as e:
            return repr(e)
        return "end of stream"


async def until_stdin_closes() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while await reader.read(4096):
        pass


async def run(args: argparse.Namespace, *, token: str) -> None:
    ctx = ssl.create_default_context(cafile=args.ca)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ssl=ctx),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=OPEN_TIMEOUT),
        headers={"Authorization": f"Bearer {token}"},
    ) as session:
        watchers = Watchers(args, session)
        tasks = [asyncio.create_task(watchers.client(i)) for i in range(args.clients)]
        try:
            await until_stdin_closes()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        final = watchers.deliveries.final()
        final[-1]["anomalies"] = watchers.out.anomalies
        watchers.out.emit(final)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak.watchers", description=__doc__)
    parser.add_argument("--url", required=True, help="the slice's collection URL")
    parser.add_argument("--ca", required=True, help="CA file of vwserver's serving certificate")
    parser.add_argument(
        "--token-file", required=True, help="bearer token (not on the command line)"
    )
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--label", required=True, help="KEY=VALUE every object must carry")
    parser.add_argument("--timeout-seconds", type=int, required=True)
    args = parser.parse_args(argv)
    token = Path(args.token_file).read_text().strip()
    # One socket per watch: lift the soft descriptor limit to the hard one.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(run(args, token=token))
    else:
        uvloop.run(run(args, token=token))
    return 0


if __name__ == "__main__":
    sys.exit(main())
