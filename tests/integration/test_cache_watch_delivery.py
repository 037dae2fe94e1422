"""How the cache's watches reach their clients' connections: written by the fan-out while a
client keeps up, through the watch's queue with backpressure when it does not, ended when it
falls too far behind — against a real vwserver (aiohttp listener) and real sockets.

Each test runs on asyncio's and on uvloop's transports (vwserver serves on uvloop); clients
that must not read are plain sockets with a small receive buffer, so that the server's side of
the connection fills up for real. Objects carry a large spec to get there with few changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import uvloop

from fakekcp.upstream import FakeUpstream, start_fake_upstream
from tests.integration.conftest import PROXY_TOKEN, SLICE_CLUSTER, routes_for, widget
from tests.integration.test_cache_shared import until
from tests.support.serve import NO_AUTH, serve_app
from vwserver.cache.registry import CacheRegistry
from vwserver.clock import SystemClock
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.metrics import ServerMetrics, upstream_name
from vwserver.proxy import cached
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Routes
from vwserver.server import build_app

WAIT = 20.0
WIDGETS = "/apis/example.io/v1alpha1/widgets"
LOOPS = pytest.mark.parametrize(
    "loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"]
)


def run(loop_factory: Callable[[], asyncio.AbstractEventLoop], scenario: Awaitable[None]) -> None:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(asyncio.wait_for(scenario, 120))


@dataclass
class Served:
    fake: FakeUpstream
    base: str
    registry: CacheRegistry
    metrics: ServerMetrics

    @property
    def path(self) -> str:
        return f"/services/filtered-apiexport/{SLICE_CLUSTER}/prod/clusters/*{WIDGETS}"

    def create(self, name: str, *, padding: int = 0) -> None:
        obj = widget(name, env="prod")
        obj["spec"]["padding"] = "x" * padding
        self.fake.create(cluster="c1", obj=obj)

    def subscribers(self) -> int:
        stats = self.registry.stats()
        return int(stats[0]["subscribers"]) if stats else 0

    def terminations(self, reason: str) -> float:
        url = self.registry.stats()[0]["url"]
        value = self.metrics.registry.get_sample_value(
            "vwserver_cache_watch_terminations_total",
            {**upstream_name(url).labels(), "reason": reason},
        )
        return value or 0.0


@contextlib.asynccontextmanager
async def served() -> AsyncIterator[Served]:
    # Bookmarks rarely: every line a client gets here is one of the test's changes.
    fake = FakeUpstream(bookmark_interval=3600, history_size=5000)
    async with start_fake_upstream(fake) as (_, vw_url):
        auth = ClientAuth(server=vw_url.removesuffix(fake.base_path), token=PROXY_TOKEN)
        async with KubeClient(auth=auth) as client:
            metrics = ServerMetrics()
            registry = CacheRegistry(
                client=client, clock=SystemClock(), idle_seconds=60, metrics=metrics
            )
            app = build_app(
                routes=Routes(routes_for(vw_url)),
                upstream=UpstreamClient(auth=auth),
                page_size=50,
                guard=NO_AUTH,
                cache=registry,
                metrics=metrics,
            )
            try:
                async with serve_app(app) as base:
                    yield Served(fake, base, registry, metrics)
            finally:
                await registry.aclose()


class RawWatch:
    """A watch on a plain socket: the test decides when its bytes are read. Parses the chunked
    body into lines; ``eof`` once the server closed the connection or ended the body."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.raw = bytearray()
        self.eof = False

    @classmethod
    async def open(cls, base: str, path: str, *, rcvbuf: int | None = None) -> RawWatch:
        host, port = base.removeprefix("http://").split(":")
        sock = socket.socket()
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
        # A small stream buffer too: the client's process holds little of what it does not read.
        reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        return cls(reader, writer)

    async def read_some(self) -> None:
        try:
            data = await self.reader.read(65536)
        except ConnectionError:
            data = b""
        if data:
            self.raw += data
        else:
            self.eof = True

    async def read_until(self, what: str, check: Callable[[], bool]) -> None:
        async with asyncio.timeout(WAIT):
            while not check() and not self.eof:
                await self.read_some()
        assert check(), f"the watch ended before {what}"

    def lines(self) -> list[dict[str, Any]]:
        """The complete lines received so far (a chunk cut off by the end is dropped)."""
        head, sep, body = bytes(self.raw).partition(b"\r\n\r\n")
        if not sep:
            return []
        assert head.startswith(b"HTTP/1.1 200"), head
        text, at = bytearray(), 0
        while True:
            end = body.find(b"\r\n", at)
            if end < 0:
                break
            size = int(body[at:end], 16)
            if size == 0 or len(body) < end + 2 + size + 2:
                break
            text += body[end + 2 : end + 2 + size]
            assert body[end + 2 + size : end + 4 + size] == b"\r\n"
            at = end + 4 + size
        return [json.loads(line) for line in bytes(text).split(b"\n")[:-1]]

    def names(self) -> list[str]:
        return [e["object"]["metadata"]["name"] for e in self.lines() if e["type"] == "ADDED"]

    def reset(self) -> None:
        """Close abruptly (RST): the client vanishes with bytes in flight."""
        sock = self.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()
        self.writer.close()

    def close(self) -> None:
        self.writer.close()


async def read_names(session: aiohttp.ClientSession, url: str, names: list[str]) -> None:
    """Append the name of every ADDED event of a watch read as fast as it comes (until
    cancelled); fails on anything but a well-formed stream of events."""
    async with session.get(url, params={"watch": "1"}) as r:
        assert r.status == 200
        async for line in r.content:
            event = json.loads(line)
            if event["type"] == "ADDED":
                names.append(event["object"]["metadata"]["name"])


@contextlib.contextmanager
def counting_takes() -> Iterator[dict[bool, int]]:
    """How often the fan-out's writer took a change, and how often it declined (the change
    then went through the watch's queue)."""
    counts = {True: 0, False: 0}
    original = cached._DirectWriter.take

    def take(self: cached._DirectWriter, item: Any) -> bool:
        took = original(self, item)
        counts[took] += 1
        return took

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cached._DirectWriter, "take", take)
        yield counts


@LOOPS
def test_a_client_that_does_not_read_is_ended_and_the_others_get_everything_in_order(
    loop_factory: Callable[[], asyncio.AbstractEventLoop], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cached, "QUEUE_SIZE", 32)  # falls behind after few large changes

    async def scenario() -> None:
        async with served() as s, aiohttp.ClientSession() as session:
            seed = [f"seed-{i}" for i in range(3)]
            for name in seed:
                s.create(name)
            stalled = await RawWatch.open(s.base, s.path + "?watch=1", rcvbuf=4096)
            fast: list[str] = []
            reader = asyncio.ensure_future(read_names(session, s.base + s.path, fast))
            try:
                await stalled_then_ended(s, stalled, fast, reader, seed)
            finally:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
                stalled.close()

    run(loop_factory, scenario())


async def stalled_then_ended(
    s: Served, stalled: RawWatch, fast: list[str], reader: asyncio.Future[None], seed: list[str]
) -> None:
    """The stalled client reads nothing after its initial state; the fast one reads at once."""
    await stalled.read_until("the initial state", lambda: len(stalled.names()) == 3)
    await until("both watches", lambda: s.subscribers() == 2 and len(fast) == 3)
    created: list[str] = []
    # Far more than the stalled client's buffers and the server's side of its
    # connection hold: its changes queue up, and the queue overflows.
    for i in range(400):
        created.append(f"big-{i:03d}")
        s.create(created[-1], padding=16_000)
        if i % 5 == 4:  # the fast client keeps up
            await until("the fast watch", lambda: len(fast) == 3 + len(created))
            if s.terminations("overflowed"):
                break
    assert s.terminations("overflowed") == 1, "the stalled watch was never ended"
    assert not reader.done()  # it was the stalled one
    for i in range(20):  # the fan-out goes on for the others
        created.append(f"after-{i:03d}")
        s.create(created[-1])
    assert s.subscribers() == 1  # the cache forgot the stalled watch at once ...
    # ... and its connection is closed although the client never reads: its handler does not
    # wait for it forever (what the server's side had sent still arrives, then the end).
    await stalled.read_until("the end", lambda: stalled.eof)
    got = stalled.names()[3:]
    assert len(got) < len(created) and got == created[: len(got)]  # a prefix, in order
    await until("the fast watch's changes", lambda: len(fast) >= 3 + len(created))
    assert fast == seed + created


@LOOPS
def test_a_client_that_stops_reading_during_its_initial_events_is_ended_too(
    loop_factory: Callable[[], asyncio.AbstractEventLoop], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cached, "QUEUE_SIZE", 8)

    async def scenario() -> None:
        async with served() as s:
            # An initial state larger than every buffer on the way (the server's side of a
            # loopback connection grows to 4 MiB).
            for i in range(500):
                s.create(f"seed-{i:03d}", padding=16_000)
            stalled = await RawWatch.open(s.base, s.path + "?watch=1", rcvbuf=4096)
            try:
                await until("the watch", lambda: s.subscribers() == 1)
                for i in range(20):  # more than its queue holds
                    s.create(f"late-{i:02d}")
                await until("its end", lambda: s.terminations("overflowed") == 1)
                # Its handler was still writing the initial events: the connection is closed.
                await stalled.read_until("the end", lambda: stalled.eof)
                got = stalled.names()
                assert got == [f"seed-{i:03d}" for i in range(len(got))]
            finally:
                stalled.close()

    run(loop_factory, scenario())


@LOOPS
def test_a_client_that_falls_behind_for_a_while_gets_every_change_once_in_order(
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    """Its connection fills up, its changes go through its queue, it catches up and the
    fan-out writes for it again: no change is lost, repeated or reordered on the way."""

    async def scenario() -> None:
        async with served() as s:
            watch = await RawWatch.open(s.base, s.path + "?watch=1", rcvbuf=4096)
            try:
                await watch.read_until("the headers", lambda: b"\r\n\r\n" in watch.raw)
                await until("the watch", lambda: s.subscribers() == 1)
                created: list[str] = []

                def create(padding: int) -> None:
                    created.append(f"w-{len(created):04d}")
                    s.create(created[-1], padding=padding)

                with counting_takes() as takes:
                    create(0)
                    await watch.read_until("the first", lambda: len(watch.names()) == 1)
                    assert takes == {True: 1, False: 0}  # a client that keeps up
                    while not takes[False] and len(created) < 2000:  # until it does not
                        create(16_000)
                        await asyncio.sleep(0)
                    assert takes[False], "the client's connection never filled up"
                    for _ in range(50):  # reading slowly while changes keep coming
                        create(1_000)
                        await watch.read_some()
                    await watch.read_until("all", lambda: len(watch.names()) == len(created))
                    took = takes[True]
                    for _ in range(10):  # caught up: written by the fan-out again
                        create(0)
                        await watch.read_until("it", lambda: len(watch.names()) == len(created))
                    assert takes[True] == took + 10
                assert watch.names() == created
            finally:
                watch.close()

    run(loop_factory, scenario())


@LOOPS
def test_a_client_that_vanishes_mid_write_leaves_quietly(
    loop_factory: Callable[[], asyncio.AbstractEventLoop], caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        async with served() as s, aiohttp.ClientSession() as session:
            gone = await RawWatch.open(s.base, s.path + "?watch=1", rcvbuf=4096)
            others: list[str] = []
            reader = asyncio.ensure_future(read_names(session, s.base + s.path, others))
            try:
                await gone.read_until("the headers", lambda: b"\r\n\r\n" in gone.raw)
                await until("both watches", lambda: s.subscribers() == 2)
                created = [f"v-{i:03d}" for i in range(60)]
                for i, name in enumerate(created):
                    s.create(name, padding=8_000)
                    if i == 20:
                        gone.reset()  # with bytes unread and more being written
                    await asyncio.sleep(0)
                await until("the vanished watch to end", lambda: s.subscribers() == 1)
                await until("the other watch's changes", lambda: len(others) == len(created))
                assert others == created
            finally:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
                gone.close()

    with caplog.at_level(logging.WARNING):
        run(loop_factory, scenario())
    noisy = [r for r in caplog.records if r.name.startswith(("vwserver", "asyncio", "aiohttp"))]
    assert noisy == [], [r.getMessage() for r in noisy]
