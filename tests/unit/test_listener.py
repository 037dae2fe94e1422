"""The listener's protocol, driven byte by byte over a fake transport, with fake time.

The timeouts of :mod:`vwserver.listener` are timers on the event loop; here the loop's
``call_later`` hands them to a :class:`FakeTime` that fires them when a test advances it, so
every case is exact and instant. ``tests/security/test_hostile_clients.py`` attacks a real
listener over sockets.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, BadStatusLine, LineTooLong

from vwserver.listener import (
    MAX_HEAD_BYTES,
    MAX_HEADER_FIELD,
    MAX_REQUEST_LINE,
    ConnectionLimits,
    _Clients,
    _GuardedHandler,
    _protocol_error,
)
from vwserver.logs import SCRUBBER
from vwserver.metrics import ServerMetrics

LIMITS = ConnectionLimits(header_timeout=10, body_timeout=60, idle_timeout=90)


@dataclass
class Timer:
    when: float
    callback: Callable[[], Any]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeTime:
    """The running loop, except that ``call_later`` timers wait for :meth:`advance`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.now = 0.0
        self.timers: list[Timer] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loop, name)

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> Timer:
        timer = Timer(self.now + delay, lambda: callback(*args))
        self.timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for timer in [t for t in self.timers if t.when <= self.now and not t.cancelled]:
            self.timers.remove(timer)
            timer.callback()


@dataclass
class FakeTransport(asyncio.Transport):
    peer: str = "10.0.0.1"
    sent: bytearray = field(default_factory=bytearray)
    closed: bool = False

    def __post_init__(self) -> None:
        super().__init__()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return (self.peer, 40000) if name == "peername" else default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.sent += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


@dataclass
class Connection:
    handler: _GuardedHandler
    transport: FakeTransport

    def send(self, data: bytes) -> None:
        self.handler.data_received(data)

    async def answer(self) -> bytes:
        for _ in range(100):
            if b"\r\n\r\n" in self.transport.sent:
                break
            await asyncio.sleep(0)
        return bytes(self.transport.sent)


@dataclass
class Listener:
    time: FakeTime
    server: web.Server
    clients: _Clients
    metrics: ServerMetrics

    def connect(self, peer: str = "10.0.0.1") -> Connection:
        handler = _GuardedHandler(
            self.server,
            clients=self.clients,
            limits=LIMITS,
            loop=self.time,
            access_log=None,
            keepalive_timeout=LIMITS.idle_timeout,
            max_line_size=MAX_REQUEST_LINE,
            max_field_size=MAX_HEADER_FIELD,
        )
        transport = FakeTransport(peer)
        handler.connection_made(transport)
        return Connection(handler, transport)

    def closed(self, reason: str) -> float:
        return self.metrics.connections_closed.labels(reason)._value.get()


@pytest.fixture
async def listener() -> Listener:
    async def ok(request: web.BaseRequest) -> web.Response:
        await request.read()
        return web.Response(text="ok")

    metrics = ServerMetrics()
    clients = _Clients(limit=2, metrics=metrics)
    return Listener(FakeTime(asyncio.get_running_loop()), web.Server(ok), clients, metrics)


async def test_a_head_not_complete_within_the_header_timeout_closes_the_connection(
    listener: Listener,
) -> None:
    idle, trickle = listener.connect(), listener.connect("10.0.0.2")
    trickle.send(b"GET / HTTP/1.1\r\nHost: x\r\n")
    listener.time.advance(9.9)
    trickle.send(b"X-More: y\r\n")  # bytes keep coming: no new deadline
    assert not idle.transport.closed and not trickle.transport.closed
    listener.time.advance(0.1)
    assert idle.transport.closed and trickle.transport.closed
    assert listener.closed("header_timeout") == 2
    assert idle.transport.sent == trickle.transport.sent == b""  # nothing to answer


async def test_a_complete_head_stops_the_header_timer_and_the_next_request_starts_it(
    listener: Listener,
) -> None:
    conn = listener.connect()
    conn.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await conn.answer()).startswith(b"HTTP/1.1 200")
    listener.time.advance(1000)  # idle keep-alive is aiohttp's (real) timer, not ours
    assert not conn.transport.closed
    conn.send(b"GET / HT")
    listener.time.advance(10)
    assert conn.transport.closed and listener.closed("header_timeout") == 1


async def test_a_body_not_complete_within_the_body_timeout_closes_the_connection(
    listener: Listener,
) -> None:
    slow, fast = listener.connect(), listener.connect("10.0.0.2")
    for conn in (slow, fast):
        conn.send(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345")
    fast.send(b"67890")
    assert (await fast.answer()).startswith(b"HTTP/1.1 200")
    listener.time.advance(59)
    slow.send(b"6789")  # still one byte short
    listener.time.advance(1)
    assert slow.transport.closed and not fast.transport.closed
    assert listener.closed("body_timeout") == 1


async def test_a_head_larger_than_the_bound_is_a_431_status_even_in_short_lines(
    listener: Listener,
) -> None:
    conn = listener.connect()
    conn.send(b"GET / HTTP/1.1\r\n")
    line = b"X-Pad: " + b"p" * 1000 + b"\r\n"
    for _ in range(MAX_HEAD_BYTES // len(line) + 1):
        conn.send(line)
    head, _, body = bytes(conn.transport.sent).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert b"Connection: close" in head and conn.transport.closed
    assert json.loads(body)["code"] == 431
    assert listener.closed("malformed") == 1


async def test_connections_over_the_per_client_bound_get_a_429_and_are_closed(
    listener: Listener,
) -> None:
    first, second = listener.connect(), listener.connect()
    third = listener.connect()
    head, _, body = bytes(third.transport.sent).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 429 Too Many Requests\r\n") and b"Retry-After: 5" in head
    assert json.loads(body)["reason"] == "TooManyRequests" and third.transport.closed
    assert not first.transport.closed and listener.clients.open["10.0.0.1"] == 2
    assert not listener.connect("10.0.0.2").transport.closed  # another client
    third.handler.connection_lost(None)  # the refused one was never counted
    assert listener.clients.open["10.0.0.1"] == 2
    first.handler.connection_lost(None)
    assert not listener.connect().transport.closed  # room again
    assert listener.closed("client_limit") == 1
    del second


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (LineTooLong(b"GET /aaaa...", MAX_REQUEST_LINE), 414),
        (LineTooLong(b"Authorization: Bearer s3cr3t...", MAX_HEADER_FIELD), 431),
        (BadHttpMessage("Too many headers received"), 431),
        (BadStatusLine("Authorization: Bearer s3cr3t"), 400),
        (BadHttpMessage("Invalid header value char:\n\n  b'Bearer s3cr3t'"), 400),
    ],
)
def test_parser_errors_map_to_a_status_of_ours(error: Exception, code: int) -> None:
    got, reason, message = _protocol_error(error)
    assert (got, reason) == (code, "BadRequest") and "s3cr3t" not in message


def test_the_scrubber_keeps_only_the_class_of_a_parser_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("test.scrubbed")
    logger.addFilter(SCRUBBER)
    try:
        error = LineTooLong(b"Authorization: Bearer s3cr3t...", MAX_HEADER_FIELD)
        logger.error("Error handling request from %s", "10.0.0.1", exc_info=error)
        logger.error("unrelated %s", "kept", exc_info=ValueError("kept too"))
    finally:
        logger.removeFilter(SCRUBBER)
    assert "s3cr3t" not in caplog.text and "LineTooLong" in caplog.text
    assert "unrelated kept" in caplog.text and "kept too" in caplog.text
