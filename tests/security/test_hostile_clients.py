"""Clients that attack the server itself, over raw sockets: each costs bounded time and memory,
is answered with a Kubernetes Status or a closed connection, never leaks a request byte into the
logs, and leaves a well-behaved client unaffected.

The server is the real listener (:func:`vwserver.listener.listening`, as ``vwserver serve`` runs
it) with short timeouts, in front of the in-repo fake upstream, on asyncio's event loop (and the
attacks once more on uvloop, which ``vwserver serve`` uses); the well-behaved client connects
from another loopback address (127.0.0.2), as a different client would. Time bounds are generous:
they tell "closed by the timeout" from "left open", not how fast the machine is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import trustme
import uvloop

from fakekcp.upstream import FakeUpstream, start_fake_upstream
from tests.integration.conftest import PROXY_TOKEN, SLICE_CLUSTER, routes_for, widget
from tests.support.raw_http import Answer, read_answer
from tests.support.serve import NO_AUTH
from tests.unit.test_bodies import BILLION_LAUGHS
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.listener import MAX_HEAD_BYTES, ConnectionLimits, listening
from vwserver.logs import JsonFormatter, formatter
from vwserver.metrics import ServerMetrics
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Routes
from vwserver.server import METRICS_KEY, build_app

HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.5
IDLE_TIMEOUT = 1.5
MAX_PER_CLIENT = 6
CLOSED_WITHIN = 10.0  # generous: any timeout above fired, nothing was left open
ATTACKER, BYSTANDER = "127.0.0.1", "127.0.0.2"
SECRET = "s3cr3t-bearer-token-never-logged"

WIDGETS = (
    f"/services/filtered-apiexport/{SLICE_CLUSTER}/prod/clusters/c1"
    "/apis/example.io/v1alpha1/namespaces/ns1/widgets"
)


@dataclass
class Target:
    host: str
    port: int
    metrics: ServerMetrics
    ssl: ssl.SSLContext | None = None
    """The client context, for a TLS target."""

    async def connect(
        self, *, local: str = ATTACKER
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(
            self.host,
            self.port,
            local_addr=(local, 0),
            ssl=self.ssl,
            server_hostname=self.host if self.ssl else None,
        )

    def url(self, path: str) -> str:
        return f"{'https' if self.ssl else 'http'}://{self.host}:{self.port}{path}"

    def closed(self, reason: str) -> float:
        return self.metrics.connections_closed.labels(reason)._value.get()


@contextlib.asynccontextmanager
async def target(
    *, tls: bool = False, header_timeout: float = HEADER_TIMEOUT, **limits: Any
) -> AsyncIterator[Target]:
    """vwserver (no auth: the attacks are on the server, not the guard) on a free port."""
    server_ctx = client_ctx = None
    if tls:
        ca = trustme.CA()
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
        client_ctx = ssl.create_default_context()
        ca.configure_trust(client_ctx)
    async with start_fake_upstream(FakeUpstream()) as (fake, vw_url):
        fake.create(cluster="c1", obj=widget("w1", env="prod"))
        app = build_app(
            routes=Routes(routes_for(vw_url)),
            upstream=UpstreamClient(
                auth=ClientAuth(server=vw_url.removesuffix(fake.base_path), token=PROXY_TOKEN)
            ),
            guard=NO_AUTH,
        )
        bounds = ConnectionLimits(
            header_timeout=header_timeout,
            body_timeout=limits.pop("body_timeout", BODY_TIMEOUT),
            idle_timeout=limits.pop("idle_timeout", IDLE_TIMEOUT),
            max_connections_per_client=limits.pop("max_connections_per_client", MAX_PER_CLIENT),
        )
        assert not limits
        async with listening(
            app, "127.0.0.1", 0, limits=bounds, ssl_context=server_ctx, metrics=app[METRICS_KEY]
        ) as site:
            host, port = site.address
            yield Target(host, port, app[METRICS_KEY], client_ctx)


async def exchange(t: Target, raw: bytes, *, local: str = ATTACKER) -> Answer | None:
    reader, writer = await t.connect(local=local)
    try:
        writer.write(raw)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        return await asyncio.wait_for(read_answer(reader), CLOSED_WITHIN)
    finally:
        writer.close()


async def closed_after(reader: asyncio.StreamReader, started: float) -> float:
    """Seconds from ``started`` until the server closed the connection (reads and drops data)."""
    async with asyncio.timeout(CLOSED_WITHIN):
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass
    return time.monotonic() - started


def request(method: str, path: str, *headers: str, body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: vwserver", *headers]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def well_behaved(t: Target, *, rounds: int = 3) -> list[int]:
    """A client on another address listing widgets, keep-alive, as kubectl would."""
    connector = aiohttp.TCPConnector(local_addr=(BYSTANDER, 0), ssl=t.ssl or False)
    codes = []
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(rounds):
            async with session.get(t.url(WIDGETS)) as r:
                await r.read()
                codes.append(r.status)
    return codes


def no_secret_in(caplog: pytest.LogCaptureFixture, *secrets: str) -> None:
    """Not in any record as either log format would write it (tracebacks included)."""
    text = formatter("text")
    for record in caplog.records:
        for rendered in (text.format(record), JsonFormatter().format(record)):
            for secret in secrets:
                assert secret not in rendered, f"request bytes in the log: {rendered[:300]}"


def no_problems(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [f"{r.name}: {r.getMessage()}" for r in bad]


# --- slow clients --------------------------------------------------------------------------------


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
async def test_a_header_trickle_is_closed_after_the_header_timeout(tls: bool) -> None:
    async with target(tls=tls) as t:
        reader, writer = await t.connect()
        started = time.monotonic()
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: vwserver\r\n")

        async def trickle() -> None:
            for i in range(100):
                writer.write(f"X-Slow-{i}: y\r\n".encode())
                await asyncio.sleep(0.2)

        trickling = asyncio.create_task(trickle())
        bystander = asyncio.create_task(well_behaved(t))
        took = await closed_after(reader, started)
        trickling.cancel()
        writer.close()
        assert HEADER_TIMEOUT * 0.8 <= took < CLOSED_WITHIN
        assert await bystander == [200, 200, 200]
        assert t.closed("header_timeout") == 1


async def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout() -> None:
    async with target() as t:
        reader, writer = await t.connect()
        assert await closed_after(reader, time.monotonic()) >= HEADER_TIMEOUT * 0.8
        writer.close()


async def test_a_tls_handshake_that_never_finishes_is_closed_too() -> None:
    async with target(tls=True) as t:
        reader, writer = await asyncio.open_connection(t.host, t.port)  # plain TCP to TLS
        writer.write(b"\x16\x03\x01")  # the start of a ClientHello, and then nothing
        took = await closed_after(reader, time.monotonic())
        writer.close()
        assert HEADER_TIMEOUT * 0.8 <= took < CLOSED_WITHIN


async def test_a_body_trickle_is_closed_after_the_body_timeout() -> None:
    async with target() as t:
        reader, writer = await t.connect()
        started = time.monotonic()
        head = request("POST", WIDGETS, "Content-Type: application/json")
        writer.write(head.replace(b"\r\n\r\n", b"\r\nContent-Length: 100000\r\n\r\n{"))

        async def trickle() -> None:
            for _ in range(100):
                writer.write(b" ")
                await asyncio.sleep(0.2)

        trickling = asyncio.create_task(trickle())
        took = await closed_after(reader, started)
        trickling.cancel()
        writer.close()
        assert BODY_TIMEOUT * 0.8 <= took < CLOSED_WITHIN
        assert t.closed("body_timeout") == 1


async def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() -> None:
    async with target(header_timeout=30.0) as t:
        reader, writer = await t.connect()
        writer.write(request("GET", "/healthz"))
        answer = await read_answer(reader)
        assert answer is not None and answer.status == 200
        assert await closed_after(reader, time.monotonic()) >= IDLE_TIMEOUT * 0.8
        writer.close()


# --- oversized and malformed requests ------------------------------------------------------------


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
async def test_a_huge_header_is_a_431_status_and_none_of_it_is_logged(
    tls: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    token = SECRET + "x" * 40_000  # one header line over the field limit
    async with target(tls=tls) as t:
        answer = await exchange(t, request("GET", WIDGETS, f"Authorization: Bearer {token}"))
        assert answer is not None and answer.status == 431
        assert answer.headers["connection"] == "close"
        assert "too large" in answer.status_doc()["message"]
        assert await well_behaved(t, rounds=1) == [200]
        assert t.closed("malformed") == 1
    assert any("431" in r.getMessage() for r in caplog.records)  # logged, as one line
    no_secret_in(caplog, SECRET, "Bearer")
    no_problems(caplog)


async def test_a_head_over_the_total_bound_is_a_431_even_when_each_line_is_short(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    lines = [f"X-Pad-{i}: {SECRET}{'p' * 8000}" for i in range(MAX_HEAD_BYTES // 8000 + 1)]
    async with target() as t:
        reader, writer = await t.connect()
        writer.write(request("GET", WIDGETS, *lines)[:-2])  # not finished: the head goes on
        answer = await asyncio.wait_for(read_answer(reader), CLOSED_WITHIN)
        writer.close()
        assert answer is not None and answer.status == 431
        answer.status_doc()
    no_secret_in(caplog, SECRET)


async def test_a_long_request_line_is_a_414_status(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with target() as t:
        answer = await exchange(t, request("GET", WIDGETS + "?labelSelector=" + "a" * 20_000))
        assert answer is not None and answer.status == 414
        answer.status_doc()
    no_secret_in(caplog, "a" * 100)


async def test_too_many_headers_is_a_431_status() -> None:
    async with target() as t:
        answer = await exchange(t, request("GET", WIDGETS, *(f"X-H{i}: v" for i in range(200))))
        assert answer is not None and answer.status == 431
        assert "too many" in answer.status_doc()["message"]


@pytest.mark.parametrize(
    "raw",
    [
        f"GET {WIDGETS} HTTP/1.1\r\nAuthorization Bearer {SECRET}\r\n\r\n".encode(),
        f"G\x00T /{SECRET} HTTP/1.1\r\n\r\n".encode(),
        f"GET / HTTP/1.1\r\nContent-Length: {SECRET}\r\n\r\n".encode(),
        f"GET / HTTP/1.1\r\nX: a\x00{SECRET}\r\n\r\n".encode(),
    ],
    ids=["no-colon", "bad-method", "bad-length", "nul"],
)
async def test_malformed_http_is_a_400_status_logged_without_its_bytes(
    raw: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with target() as t:
        answer = await exchange(t, raw)
        assert answer is not None and answer.status == 400
        answer.status_doc()
    no_secret_in(caplog, SECRET)
    no_problems(caplog)


# --- greedy clients ------------------------------------------------------------------------------


async def test_connections_over_the_per_client_bound_are_refused_with_429() -> None:
    async with target(header_timeout=30.0) as t:
        held = [await t.connect() for _ in range(MAX_PER_CLIENT)]
        reader, writer = await t.connect()
        answer = await asyncio.wait_for(read_answer(reader), CLOSED_WITHIN)
        writer.close()
        # Refused at once: with a Status if the client reads it before the close, else closed.
        if answer is not None:
            assert answer.status == 429 and answer.headers["retry-after"]
            answer.status_doc()
        assert t.closed("client_limit") == 1
        assert await well_behaved(t, rounds=2) == [200, 200]  # another address: unaffected
        held.pop()[1].close()  # one of the attacker's own goes: it may connect again
        await asyncio.sleep(0.2)
        answer = await exchange(t, request("GET", "/healthz"))
        assert answer is not None and answer.status == 200
        for _, w in held:
            w.close()


# --- hostile bodies (decoded by vwserver.proxy.bodies in proxy/writes.py) -----------------------


async def test_deeply_nested_json_is_a_400_status_not_a_500(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    body = b'{"apiVersion":"example.io/v1alpha1","kind":"Widget","spec":' + b"[" * 10_000
    body += b"]" * 10_000 + b"}"
    async with target() as t:
        answer = await exchange(
            t, request("POST", WIDGETS, "Content-Type: application/json", body=body)
        )
        assert answer is not None and answer.status == 400
        assert "nested deeper" in answer.status_doc()["message"]
    no_problems(caplog)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def test_a_yaml_alias_bomb_is_a_quick_400_in_bounded_memory(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with target() as t:
        before, started = rss_mb(), time.monotonic()
        answer = await exchange(
            t,
            request(
                "PATCH",
                WIDGETS + "/w1?fieldManager=attacker",
                "Content-Type: application/apply-patch+yaml",
                body=BILLION_LAUGHS,
            ),
        )
        took, grew = time.monotonic() - started, rss_mb() - before
        assert answer is not None and answer.status == 400, answer
        assert "aliases expanded" in answer.status_doc()["message"]
        assert took < 5.0 and grew < 50, (took, grew)
    no_problems(caplog)


async def test_a_well_behaved_client_is_served_while_every_attack_runs() -> None:
    async with target() as t:
        stop = asyncio.Event()

        async def trickler() -> None:
            while not stop.is_set():
                reader, writer = await t.connect()
                writer.write(b"GET /healthz HTTP/1.1\r\n")
                with contextlib.suppress(ConnectionError, TimeoutError):
                    async with asyncio.timeout(CLOSED_WITHIN):
                        while not stop.is_set() and not reader.at_eof():
                            writer.write(b"X: y\r\n")
                            await asyncio.sleep(0.1)
                writer.close()

        async def bodies() -> None:
            deep = b"[" * 5000 + b"]" * 5000
            while not stop.is_set():
                for method, kind, body in [
                    ("POST", "application/json", deep),
                    ("PATCH", "application/apply-patch+yaml", BILLION_LAUGHS),
                ]:
                    path = WIDGETS if method == "POST" else WIDGETS + "/w1?fieldManager=x"
                    await exchange(t, request(method, path, f"Content-Type: {kind}", body=body))

        attackers = [asyncio.create_task(trickler()) for _ in range(MAX_PER_CLIENT - 2)]
        attackers.append(asyncio.create_task(bodies()))
        try:
            await asyncio.sleep(0.3)
            assert await well_behaved(t, rounds=10) == [200] * 10
        finally:
            stop.set()
            await asyncio.gather(*attackers, return_exceptions=True)


def test_the_attacks_fail_the_same_way_on_uvloop() -> None:
    """``vwserver serve`` runs on uvloop, whose transports and TLS are its own."""

    async def attacks() -> None:
        async with target(tls=True) as t:
            reader, writer = await t.connect()
            writer.write(b"GET /healthz HTTP/1.1\r\n")
            assert await closed_after(reader, time.monotonic()) >= HEADER_TIMEOUT * 0.8
            writer.close()
            reader, writer = await asyncio.open_connection(t.host, t.port)  # no TLS handshake
            assert await closed_after(reader, time.monotonic()) >= HEADER_TIMEOUT * 0.8
            writer.close()
            huge = await exchange(
                t, request("GET", WIDGETS, "Authorization: Bearer " + SECRET * 2000)
            )
            assert huge is not None and huge.status == 431
            bomb = request(
                "PATCH",
                WIDGETS + "/w1?fieldManager=x",
                "Content-Type: application/apply-patch+yaml",
                body=BILLION_LAUGHS,
            )
            answer = await exchange(t, bomb)
            assert answer is not None and answer.status == 400
            held = [await t.connect() for _ in range(MAX_PER_CLIENT)]
            over = await exchange(t, request("GET", "/healthz"))
            assert over is None or over.status == 429
            assert await well_behaved(t, rounds=2) == [200, 200]
            for _, w in held:
                w.close()

    uvloop.run(attacks())
