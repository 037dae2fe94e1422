"""GETs of one object over the proxy's own keep-alive connections (UpstreamClient.fetch,
vwserver.proxy.connections), against real sockets: scripted raw HTTP/1.1 upstreams, and aiohttp
servers over TLS.

What matters beyond "the body arrives": a connection is reused only after a response read exactly
to its end, so no request ever reads another's leftovers; an idle connection the upstream closed
costs a retry, not an error; failures are the proxy's 503/502; vwserver's TLS identity and a
caller's never share a connection. Timeouts run on fake timers.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
import trustme
import uvloop
from aiohttp import web
from aiohttp.http import SERVER_SOFTWARE
from multidict import CIMultiDict

from tests.support.serve import serve_app
from vwserver.errors import BadGateway, BadRequest, UpstreamUnreachable
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.proxy.connections import KEEPALIVE, ConnectionPool, Fetched, Timers
from vwserver.proxy.http1 import request_head
from vwserver.proxy.upstream import UpstreamClient

WAIT = 10.0  # seconds any single step may take before the test fails instead of hanging

Answer = Callable[["Exchange"], Awaitable[None]]


@dataclass
class Exchange:
    """One request a raw upstream received, and how to answer it."""

    request: bytes
    number: int
    """1 for the first request on its connection, 2 for the next, ..."""
    connection: int
    """Which accepted connection (1, 2, ...)."""
    writer: asyncio.StreamWriter

    async def send(self, data: bytes, *, close: bool = False) -> None:
        self.writer.write(data)
        await self.writer.drain()
        if close:
            self.writer.close()


@dataclass
class RawUpstream:
    """An HTTP/1.1 upstream on a loopback socket whose answers a test scripts byte by byte."""

    answer: Answer
    port: int = 0
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    received: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/clusters/c/api/v1/namespaces/n/configmaps/x"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        connection = self.connections
        self.writers.append(writer)
        number = 0
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                number += 1
                self.requests.append(request)
                self.received.set()
                await self.answer(Exchange(request, number, connection, writer))
                if writer.is_closing():
                    return


@contextlib.asynccontextmanager
async def raw_upstream(answer: Answer) -> AsyncIterator[RawUpstream]:
    upstream = RawUpstream(answer)
    server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
    upstream.port = server.sockets[0].getsockname()[1]
    try:
        yield upstream
    finally:
        for writer in upstream.writers:
            writer.close()
        server.close()
        await server.wait_closed()


def ok(body: bytes, *, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


async def answer_ok(exchange: Exchange) -> None:
    await exchange.send(ok(b'{"n":%d}' % exchange.number))


class FakeTimers:
    """The loop's time and timers, except that time moves only in :meth:`advance`."""

    @dataclass
    class Handle:
        when: float
        callback: Callable[[], Any]
        cancelled: bool = False

        def cancel(self) -> None:
            self.cancelled = True

    def __init__(self) -> None:
        self.now = 0.0
        self.handles: list[FakeTimers.Handle] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], Any], /) -> asyncio.TimerHandle:
        handle = FakeTimers.Handle(when, callback)
        self.handles.append(handle)
        return cast(asyncio.TimerHandle, handle)

    async def advance(self, seconds: float) -> None:
        self.now += seconds
        while due := [h for h in self.handles if not h.cancelled and h.when <= self.now]:
            for handle in due:
                self.handles.remove(handle)
                handle.callback()
        for _ in range(5):
            await asyncio.sleep(0)

    @property
    def pending(self) -> int:
        return sum(1 for h in self.handles if not h.cancelled)


def pool(timers: Timers | None = None) -> ConnectionPool:
    return ConnectionPool(connect_timeout=WAIT, timers=timers)


async def get(p: ConnectionPool, up: RawUpstream, *, limit: int = 1 << 20) -> Fetched:
    request = request_head(target="/x", host=f"127.0.0.1:{up.port}", fields=[])
    return await asyncio.wait_for(
        p.get(
            host="127.0.0.1", port=up.port, tls=None, request=request, read_timeout=60, limit=limit
        ),
        WAIT,
    )


@contextlib.asynccontextmanager
async def started(auth: ClientAuth) -> AsyncIterator[UpstreamClient]:
    client = UpstreamClient(auth=auth)
    await client.start()
    try:
        yield client
    finally:
        await client.close()


# --- keep-alive ---------------------------------------------------------------------------------


async def test_one_connection_carries_request_after_request() -> None:
    p = pool()
    async with raw_upstream(answer_ok) as up:
        bodies = [(await get(p, up)).body for _ in range(5)]
    p.close()
    assert bodies == [b'{"n":%d}' % n for n in range(1, 6)]
    assert up.connections == 1


async def test_chunked_body_arriving_in_pieces() -> None:
    parts = [b"a" * 70_000, b"b" * 3, b"c" * 200_000]

    async def answer(exchange: Exchange) -> None:
        raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(*parts)
        for i in range(0, len(raw), 4093):
            await exchange.send(raw[i : i + 4093])
            await asyncio.sleep(0)

    p = pool()
    async with raw_upstream(answer) as up:
        first, second = await get(p, up), await get(p, up)
    p.close()
    assert first.body == second.body == b"".join(parts)
    assert up.connections == 1


async def test_interim_responses_are_skipped() -> None:
    async def answer(exchange: Exchange) -> None:
        await exchange.send(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n\r\n")
        await exchange.send(ok(b"final"))

    p = pool()
    async with raw_upstream(answer) as up:
        got = await get(p, up)
    p.close()
    assert (got.status, got.body) == (200, b"final")


@pytest.mark.parametrize(
    "answer_bytes",
    [
        ok(b"bye", extra=b"Connection: close\r\n"),
        b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nbye",
    ],
)
async def test_a_connection_the_upstream_ends_is_not_reused(answer_bytes: bytes) -> None:
    async def answer(exchange: Exchange) -> None:
        await exchange.send(answer_bytes)  # and the socket stays open: the client must not reuse

    p = pool()
    async with raw_upstream(answer) as up:
        for _ in range(3):
            assert (await get(p, up)).body == b"bye"
    p.close()
    assert up.connections == 3


async def test_bytes_after_a_response_never_reach_the_next_request() -> None:
    smuggled = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil"

    async def answer(exchange: Exchange) -> None:
        if exchange.connection == 1:
            await exchange.send(ok(b"first") + smuggled)
        else:
            await answer_ok(exchange)

    p = pool()
    async with raw_upstream(answer) as up:
        assert (await get(p, up)).body == b"first"
        assert (await get(p, up)).body == b'{"n":1}'
    p.close()
    assert up.connections == 2


async def test_bytes_on_an_idle_connection_end_it() -> None:
    p = pool()
    async with raw_upstream(answer_ok) as up:
        assert (await get(p, up)).body == b'{"n":1}'
        up.writers[0].write(ok(b"evil"))
        await up.writers[0].drain()
        await asyncio.sleep(0.05)  # lets the bytes arrive; the result does not depend on it
        assert (await get(p, up)).body == b'{"n":1}'
    p.close()
    assert up.connections == 2


async def test_idle_connection_closed_by_the_upstream_is_retried_once() -> None:
    async def answer(exchange: Exchange) -> None:
        if exchange.number == 1:
            await answer_ok(exchange)
        else:
            exchange.writer.close()  # the idle-close race: the request was sent, no answer

    p = pool()
    async with raw_upstream(answer) as up:
        assert (await get(p, up)).body == b'{"n":1}'
        assert (await get(p, up)).body == b'{"n":1}'
    p.close()
    assert (up.connections, len(up.requests)) == (2, 3)


async def test_a_new_connection_that_closes_unanswered_is_503() -> None:
    async def answer(exchange: Exchange) -> None:
        exchange.writer.close()

    p = pool()
    async with raw_upstream(answer) as up:
        with pytest.raises(UpstreamUnreachable) as caught:
            await get(p, up)
    p.close()
    assert caught.value.retry_after == 1
    assert len(up.requests) == 1  # no retry of a request on a connection made for it


# --- failures -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer_bytes",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Le",
    ],
)
async def test_connection_ending_mid_response_is_503(answer_bytes: bytes) -> None:
    async def answer(exchange: Exchange) -> None:
        await exchange.send(answer_bytes, close=True)

    p = pool()
    async with raw_upstream(answer) as up:
        with pytest.raises(UpstreamUnreachable):
            await get(p, up)
    p.close()


async def test_body_up_to_the_close_is_read_whole() -> None:
    async def answer(exchange: Exchange) -> None:
        await exchange.send(b"HTTP/1.1 200 OK\r\n\r\nuntil the end", close=True)

    p = pool()
    async with raw_upstream(answer) as up:
        assert (await get(p, up)).body == b"until the end"
    p.close()


@pytest.mark.parametrize(
    "answer_bytes",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nX: a\x00b\r\nContent-Length: 0\r\n\r\n",
        b"garbage\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 20_000 + b"\r\n",
    ],
)
async def test_malformed_response_is_502_and_ends_the_connection(answer_bytes: bytes) -> None:
    async def answer(exchange: Exchange) -> None:
        await exchange.send(answer_bytes if exchange.connection == 1 else ok(b"fine"))

    p = pool()
    async with raw_upstream(answer) as up:
        with pytest.raises(BadGateway, match="malformed"):
            await get(p, up)
        assert (await get(p, up)).body == b"fine"
    p.close()
    assert up.connections == 2


@pytest.mark.parametrize(
    "answer_bytes",
    [
        ok(b"x" * 101),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(b"x" * 60, b"y" * 41),
        b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 101,
    ],
)
async def test_body_over_the_limit_is_502(answer_bytes: bytes) -> None:
    async def answer(exchange: Exchange) -> None:
        await exchange.send(answer_bytes, close=True)

    p = pool()
    async with raw_upstream(answer) as up:
        with pytest.raises(BadGateway, match="larger than 100 bytes"):
            await get(p, up, limit=100)
    p.close()


async def test_unreachable_upstream_is_503() -> None:
    async with raw_upstream(answer_ok) as up:
        port = up.port
    p = pool()
    with pytest.raises(UpstreamUnreachable, match=f"127.0.0.1:{port} unreachable"):
        await p.get(
            host="127.0.0.1",
            port=port,
            tls=None,
            request=request_head(target="/", host="x", fields=[]),
            read_timeout=1,
            limit=10,
        )


async def test_a_cancelled_request_gives_up_its_connection() -> None:
    release = asyncio.Event()

    async def answer(exchange: Exchange) -> None:
        if exchange.connection == 1:
            await release.wait()
        await answer_ok(exchange)

    p = pool()
    async with raw_upstream(answer) as up:
        task = asyncio.create_task(get(p, up))
        await asyncio.wait_for(up.received.wait(), WAIT)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()  # the late answer must not be read by the next request
        assert (await get(p, up)).body == b'{"n":1}'
    p.close()
    assert up.connections == 2


# --- time ---------------------------------------------------------------------------------------


async def test_read_timeout_counts_silence_not_the_whole_response() -> None:
    timers = FakeTimers()
    more = asyncio.Event()

    async def answer(exchange: Exchange) -> None:
        await exchange.send(b"HTTP/1.1 200 OK\r\n")
        await more.wait()
        await exchange.send(b"Content-Length: 2\r\n")
        # then nothing more

    p = pool(timers)
    async with raw_upstream(answer) as up:
        task = asyncio.create_task(get(p, up))
        await asyncio.wait_for(up.received.wait(), WAIT)
        await timers.advance(59)
        assert not task.done()
        more.set()
        await asyncio.sleep(0.05)  # lets the bytes arrive at t=59
        await timers.advance(59)  # t=118: 59 s after the last bytes
        assert not task.done()
        await timers.advance(2)  # t=120: 61 s of silence
        with pytest.raises(UpstreamUnreachable, match="TimeoutError"):
            await asyncio.wait_for(task, WAIT)
    p.close()
    assert timers.pending == 0


async def test_idle_connections_expire() -> None:
    timers = FakeTimers()
    p = pool(timers)
    async with raw_upstream(answer_ok) as up:
        await get(p, up)
        await timers.advance(KEEPALIVE - 1)
        await get(p, up)
        assert up.connections == 1
        await timers.advance(KEEPALIVE + 1)
        await get(p, up)
        assert up.connections == 2
    p.close()
    assert timers.pending == 0


# --- through UpstreamClient ---------------------------------------------------------------------


async def test_fetch_sends_the_checked_request() -> None:
    async with (
        raw_upstream(answer_ok) as up,
        started(ClientAuth(server=f"http://127.0.0.1:{up.port}", token="vw-token")) as client,
    ):
        headers = CIMultiDict({"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
        got = await client.fetch(up.url, query=[("resourceVersion", "5 6")], headers=headers)
        await client.fetch(up.url, headers=CIMultiDict({"User-Agent": "kubectl/v1.31"}))
        with pytest.raises(BadRequest, match="User-Agent"):
            await client.fetch(up.url, headers=CIMultiDict({"User-Agent": "a\r\nX-Remote-User: x"}))
    assert got.status == 200
    assert up.requests == [
        b"GET /clusters/c/api/v1/namespaces/n/configmaps/x?resourceVersion=5+6 HTTP/1.1\r\n"
        b"Host: 127.0.0.1:%d\r\n"
        b"Accept: application/json;as=Table;v=v1;g=meta.k8s.io\r\n"
        b"User-Agent: %s\r\n"
        b"Accept-Encoding: identity\r\n"
        b"Authorization: Bearer vw-token\r\n\r\n" % (up.port, SERVER_SOFTWARE.encode()),
        b"GET /clusters/c/api/v1/namespaces/n/configmaps/x HTTP/1.1\r\n"
        b"Host: 127.0.0.1:%d\r\n"
        b"User-Agent: kubectl/v1.31\r\n"
        b"Accept-Encoding: identity\r\n"
        b"Authorization: Bearer vw-token\r\n\r\n" % up.port,
    ]


def test_fetch_on_uvloop() -> None:
    """vwserver serves on uvloop, whose transports differ from asyncio's."""

    async def scenario() -> tuple[list[bytes], int]:
        async def answer(exchange: Exchange) -> None:
            if exchange.number == 2:
                raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                await exchange.send(raw + chunked(b"chunked ", b"body"))
            else:
                await answer_ok(exchange)

        async with (
            raw_upstream(answer) as up,
            started(ClientAuth(server=f"http://127.0.0.1:{up.port}")) as client,
        ):
            bodies = [(await client.fetch(up.url)).body for _ in range(3)]
            return bodies, up.connections

    bodies, connections = uvloop.run(asyncio.wait_for(scenario(), WAIT))
    assert bodies == [b'{"n":1}', b"chunked body", b'{"n":3}']
    assert connections == 1


async def test_vwserver_and_caller_connections_never_mix() -> None:
    """kcp would authenticate vwserver by its client certificate before looking at a bearer
    token: a caller's request (passthrough) must not go over a connection that presented it."""
    server_ca, client_ca = trustme.CA(), trustme.CA()
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    client_ca.configure_trust(server_ctx)
    server_ctx.verify_mode = ssl.CERT_OPTIONAL
    connections: dict[int, list[str]] = {}

    async def who(request: web.Request) -> web.Response:
        assert request.transport is not None
        cert = request.transport.get_extra_info("peercert") or {}
        cn = [v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"]
        connections.setdefault(id(request.transport), []).append(",".join(cn) or "-")
        return web.json_response({"cn": cn, "auth": request.headers.get("Authorization")})

    app = web.Application()
    app.router.add_get("/who", who)
    vw_cert = client_ca.issue_cert("vwserver.example", common_name="vwserver")
    async with serve_app(app, ssl_context=server_ctx) as url:
        auth = ClientAuth(
            server=url,
            ca_pem=server_ca.cert_pem.bytes().decode(),
            token="vw-token",
            client_cert_pem=vw_cert.cert_chain_pems[0].bytes().decode(),
            client_key_pem=vw_cert.private_key_pem.bytes().decode(),
        )
        async with started(auth) as client:
            seen = []
            for upstream in (client, client.for_caller("caller-token")) * 2:
                got = await upstream.fetch(f"{url}/who")
                seen.append(got.body)
    assert (
        seen
        == [
            b'{"cn": ["vwserver"], "auth": "Bearer vw-token"}',
            b'{"cn": [], "auth": "Bearer caller-token"}',
        ]
        * 2
    )
    # Two connections, each reused, each with one identity.
    assert sorted(connections.values()) == [["-", "-"], ["vwserver", "vwserver"]]


async def test_https_without_a_context_of_vwserver_s_own_goes_through_aiohttp() -> None:
    """An https upstream URL under an ``http://`` server setting has no TLS settings of
    vwserver's: it is fetched as before the proxy had connections of its own, by the session."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    trustme.CA().issue_cert("127.0.0.1").configure_cert(server_ctx)

    async def x(_: web.Request) -> web.Response:
        return web.Response(body=b"via aiohttp")

    app = web.Application()
    app.router.add_get("/x", x)
    async with (
        serve_app(app, ssl_context=server_ctx) as url,
        started(ClientAuth(server="http://127.0.0.1:1")) as client,
    ):
        got = await client.fetch(f"{url}/x")
    assert (got.status, got.body) == (200, b"via aiohttp")
