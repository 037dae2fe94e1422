"""Keep-alive connections to the upstream for whole-response GETs (:mod:`vwserver.proxy.http1`).

A connection carries one request at a time and goes back to the pool only when its response was
read exactly to its end: after an error, a timeout, a cancelled request (the client went away),
``Connection: close``, or bytes beyond the response, it is closed instead, so the next request on
a pooled connection never reads leftovers of another's. Connections are pooled per host, port and
TLS context — the caller's own context in passthrough mode carries no client certificate, and
must never share a connection with vwserver's (:meth:`UpstreamClient.for_caller`).

An idle connection may be closed by the upstream at any time; a GET is idempotent (RFC 9110
§9.2.2), so a request whose pooled connection turns out closed before any byte of an answer is
sent once more on a new connection. Idle connections are dropped after :data:`KEEPALIVE` seconds.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol, cast

from multidict import CIMultiDictProxy

from vwserver.errors import BadGateway, UpstreamUnreachable
from vwserver.proxy.http1 import BodyTooLarge, MalformedResponse, ResponseReader

KEEPALIVE: Final = 15.0
"""Seconds an idle connection is kept (aiohttp's default, which the rest of the proxy uses)."""
MAX_IDLE: Final = 256
"""Idle connections kept per upstream host and TLS context."""
RETRY_AFTER_SECONDS: Final = 1


@dataclass(slots=True)
class Fetched:
    """A whole upstream response."""

    status: int
    headers: CIMultiDictProxy[str]
    body: bytes


_Key = tuple[str, int, ssl.SSLContext | None]


class Timers(Protocol):
    """The event loop's time and timers (a fake in tests of the timeouts)."""

    def time(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], Any], /) -> asyncio.TimerHandle: ...


class _Stale(Exception):
    """The connection was closed before any byte of the answer arrived (for a pooled one: by
    the upstream while it was idle)."""


class _Connection(asyncio.Protocol):
    """One upstream connection: what it received so far, and whether it has ended."""

    def __init__(self, timers: Timers) -> None:
        self.transport: asyncio.Transport | None = None
        self.reader: ResponseReader | None = None
        """The response of the exchange under way, read as its bytes arrive."""
        self.failure: MalformedResponse | BodyTooLarge | None = None
        """Why the reader refused the response under way."""
        self.ended = False
        """The upstream closed the connection, or it broke."""
        self.error: BaseException | None = None
        """Why the connection ended, if not by an orderly close."""
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._timers = timers
        # The read timeout of the exchange under way: one timer per exchange, moved on lazily
        # (when it fires) rather than at every read.
        self._read_timeout = 0.0
        self._last_read = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timed_out = False
        self._busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not asyncio.Transport subclasses: no isinstance).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        if not self._busy or reader is None:
            self.abort()  # bytes nobody asked for: this connection is not to be trusted
            return
        if self._timer is not None:
            self._last_read = self._timers.time()
        if self.failure is not None:
            return
        # Read here, as the bytes arrive: the exchange is woken once, when the response is
        # complete (or refused), not for every piece of a large body.
        try:
            done = reader.feed(data)
        except (MalformedResponse, BodyTooLarge) as e:
            self.failure = e
            done = True
        if done:
            self._wake()

    def eof_received(self) -> bool:
        self.ended = True
        self._wake()
        return False  # the transport closes; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.error = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def begin(self, reader: ResponseReader, read_timeout: float | None) -> None:
        """Start an exchange whose response ``reader`` reads: from now on, :meth:`more` fails
        once ``read_timeout`` seconds pass without a byte received (an idle timeout, like
        aiohttp's ``sock_read``)."""
        self.reader = reader
        self.failure = None
        self._busy = True
        self._timed_out = False
        if read_timeout is not None:
            self._read_timeout = read_timeout
            self._last_read = self._timers.time()
            self._timer = self._timers.call_at(self._last_read + read_timeout, self._check_idle)

    def finish(self) -> None:
        """End the exchange (its read timeout)."""
        self._busy = False
        self.reader = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check_idle(self) -> None:
        deadline = self._last_read + self._read_timeout
        if self._timers.time() < deadline:
            self._timer = self._timers.call_at(deadline, self._check_idle)
            return
        self._timer = None
        self._timed_out = True
        self._wake()

    async def more(self) -> None:
        """Wait until the response is complete or refused, or the connection ends; TimeoutError
        when the exchange's read timeout passes first."""
        if not self.ended and not self._timed_out:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        if self._timed_out:
            raise TimeoutError()

    @property
    def usable(self) -> bool:
        """Open in both directions (a transport closes a moment before connection_lost)."""
        return not self.ended and self.transport is not None and not self.transport.is_closing()

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def abort(self) -> None:
        self.ended = True
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        self.ended = True
        if self.transport is not None:
            self.transport.close()


class ConnectionPool:
    """Idle keep-alive connections by upstream host, port and TLS context; one GET at a time on
    each (:meth:`get`)."""

    def __init__(
        self,
        *,
        connect_timeout: float,
        keepalive: float = KEEPALIVE,
        max_idle: int = MAX_IDLE,
        timers: Timers | None = None,
    ) -> None:
        """``timers``: the running loop's when None."""
        self._connect_timeout = connect_timeout
        self._keepalive = keepalive
        self._max_idle = max_idle
        self._timers = timers
        self._idle: dict[_Key, list[_Connection]] = {}
        self._closed = False

    def idle(self) -> int:
        """Idle connections held (open or not yet found closed)."""
        return sum(len(conns) for conns in self._idle.values())

    def close(self) -> None:
        """Close every idle connection; connections in use close when their request ends."""
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()

    async def get(
        self,
        *,
        host: str,
        port: int,
        tls: ssl.SSLContext | None,
        request: bytes,
        read_timeout: float | None,
        limit: int,
    ) -> Fetched:
        """Send ``request`` (a whole GET, :func:`vwserver.proxy.http1.request_head`) and read
        the whole response; its body is at most ``limit`` bytes (else BadGateway)."""
        key = (host, port, tls)
        conn = self._take(key)
        if conn is not None:
            try:
                return await self._exchange(conn, key, request, read_timeout, limit, reused=True)
            except _Stale:
                pass  # closed by the upstream while idle: once more on a new connection
        conn = await self._connect(key)
        return await self._exchange(conn, key, request, read_timeout, limit, reused=False)

    def _loop_timers(self) -> Timers:
        return self._timers or asyncio.get_running_loop()

    def _now(self) -> float:
        return self._loop_timers().time()

    def _take(self, key: _Key) -> _Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        oldest_kept = self._now() - self._keepalive
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to be closed
            if not conn.usable or conn.idle_since < oldest_kept:
                conn.abort()  # closed (also for sending something unasked), or idle too long
                continue
            return conn
        return None

    def _put(self, key: _Key, conn: _Connection) -> None:
        if self._closed:
            conn.close()
            return
        now = self._now()
        conn.idle_since = now
        idle = self._idle.setdefault(key, [])
        while idle and (idle[0].ended or idle[0].idle_since < now - self._keepalive):
            idle.pop(0).abort()
        if len(idle) >= self._max_idle:
            conn.close()
            return
        idle.append(conn)

    async def _connect(self, key: _Key) -> _Connection:
        host, port, tls = key
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                timers = self._loop_timers()
                _, conn = await loop.create_connection(
                    lambda: _Connection(timers),
                    host,
                    port,
                    ssl=tls,
                    server_hostname=host if tls else None,
                )
        except (OSError, TimeoutError) as e:  # ssl.SSLError (certificates too) is an OSError
            raise _unreachable(key, e) from e
        return conn

    async def _exchange(
        self,
        conn: _Connection,
        key: _Key,
        request: bytes,
        read_timeout: float | None,
        limit: int,
        *,
        reused: bool,
    ) -> Fetched:
        reusable = False
        try:
            if not conn.usable:
                raise _Stale() if reused else _unreachable(key, conn.error)
            reader = ResponseReader(limit=limit)
            conn.begin(reader, read_timeout)
            conn.send(request)
            while not reader.complete:
                if conn.failure is not None:
                    raise conn.failure
                if conn.ended:
                    if not reader.started:
                        raise _Stale()
                    # A body up to the close ends where the upstream closes in good order.
                    if conn.error is None and reader.at_eof():
                        break
                    raise _Broken()
                await conn.more()
            if conn.failure is not None:
                raise conn.failure
            # Bytes after the response were not asked for: such a connection is not reused.
            reusable = reader.keep_alive and not reader.trailing and not conn.ended
            return Fetched(reader.status, reader.headers, reader.body)
        except _Stale:
            if reused:
                raise
            raise _unreachable(key, conn.error) from conn.error
        except _Broken:
            raise _unreachable(key, conn.error) from conn.error
        except (OSError, TimeoutError) as e:
            raise _unreachable(key, e) from e
        except MalformedResponse as e:
            raise BadGateway(f"upstream sent a malformed response: {e}") from e
        except BodyTooLarge as e:
            raise BadGateway(f"upstream response larger than {limit} bytes") from e
        finally:
            conn.finish()
            if reusable:
                self._put(key, conn)
            else:
                conn.abort()


class _Broken(Exception):
    """The connection ended in the middle of a response."""


def _unreachable(key: _Key, error: BaseException | None) -> UpstreamUnreachable:
    host, port, _ = key
    what = type(error).__name__ if error is not None else "connection closed by the upstream"
    return UpstreamUnreachable(
        f"upstream {host}:{port} unreachable: {what}", retry_after=RETRY_AFTER_SECONDS
    )
