"""The listening socket of ``vwserver serve``: bounded work per connection, whoever connects.

aiohttp parses HTTP/1.1 well but leaves a server open to clients that are slow or greedy on
purpose, and it logs malformed requests with their first bytes. This module runs the app behind
a protocol of its own (a :class:`aiohttp.web.RequestHandler` subclass, the same for plain HTTP
and TLS) that adds what kube-apiserver gets from Go's ``http.Server`` and more:

* **Request head size.** A request line of at most :data:`MAX_REQUEST_LINE` bytes (longer: 414),
  header lines of at most :data:`MAX_HEADER_FIELD` (name and value), at most :data:`MAX_HEADERS`
  of them, and :data:`MAX_HEAD_BYTES` in all (431). The apiserver allows 1 MiB of headers
  (``MaxHeaderBytes``); real heads are a few KB, the largest part a bearer token (OIDC tokens
  with many groups reach ~10 KB), and every connection may hold a head this size in memory.
* **Header timeout** (``connections.headerTimeoutSeconds``). A request's head must be complete
  within this time of the connection being made (after the TLS handshake, which gets the same
  time) or of the first byte of a later request; else the connection is closed. Without it a
  client trickling one header byte every few seconds ("slowloris") held a connection forever.
  kube-apiserver uses ``ReadHeaderTimeout: 32s``; vwserver's clients send the head in one write
  right after connecting, so the default is 10 s.
* **Body timeout** (``bodyTimeoutSeconds``): a request body must have arrived completely within
  this time of its head (kube-apiserver: the 60 s request timeout). Else the connection closes and
  the handler waiting for the body is cancelled.
* **Idle timeout** (``idleTimeoutSeconds``): a keep-alive connection without a request closes
  after this long; 90 s like kube-apiserver (and client-go's idle connection timeout).
* **Connections per client** (``maxConnectionsPerClient``, by IP address): one more is answered
  ``429`` (a Status, ``Retry-After``) and closed at once. Every watch holds a connection over
  HTTP/1.1, so the default (256) is far above what one controller opens; behind a proxy or a
  load balancer that hides client addresses, raise it or set 0 (no limit).

No response names the server's software: aiohttp adds ``Server: Python/3.x aiohttp/3.x`` to
every response it writes (app answers, 404s of unknown paths, its error answers), which tells an
attacker which stack and versions to look up; kube-apiserver sends no ``Server`` header, and
every request's writer here drops it just before the head is serialized
(:func:`_without_server`).

Malformed requests are answered with a Kubernetes ``Status`` (400, 414 or 431; ``Connection:
close``) and logged as one line naming the error class and the client address, never the bytes
received: aiohttp's own message quotes the offending line, which was once the start of an
``Authorization: Bearer …`` header. Every closed or refused connection is counted in
``vwserver_connections_closed_total{reason}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from http import HTTPStatus
from ssl import SSLContext
from typing import Any, cast

from aiohttp import hdrs, web
from aiohttp.http_exceptions import BadHttpMessage, HttpProcessingError, LineTooLong
from aiohttp.http_writer import StreamWriter
from multidict import CIMultiDict

from vwserver.config.base import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
)
from vwserver.k8s.status import status_body
from vwserver.logs import scrub_aiohttp_logs
from vwserver.metrics import ServerMetrics

log = logging.getLogger(__name__)

MAX_REQUEST_LINE = 16 * 1024
"""Bytes of the request line: long label selectors and continue tokens fit."""
MAX_HEADER_FIELD = 32 * 1024
"""Bytes of one header line, name and value: large OIDC bearer tokens fit."""
MAX_HEADERS = 100
"""Header lines per request; clients send about ten."""
MAX_HEAD_BYTES = 64 * 1024
"""Bytes of a whole request head, also when it is sent slowly."""

RETRY_AFTER_SECONDS = 5

# vwserver_connections_closed_total{reason}
TOO_MANY_CONNECTIONS = "client_limit"
HEADER_TIMEOUT = "header_timeout"
BODY_TIMEOUT = "body_timeout"
MALFORMED = "malformed"


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The configurable bounds (``connections`` in the config file); see the module docstring."""

    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    max_connections_per_client: int = DEFAULT_MAX_CONNECTIONS_PER_CLIENT
    """0: no limit."""


@dataclass(slots=True)
class _Clients:
    """Open connections per client address, shared by every connection of one listener."""

    limit: int
    metrics: ServerMetrics | None
    open: Counter[str] = field(default_factory=Counter)

    def admit(self, client: str) -> bool:
        if self.limit and self.open[client] >= self.limit:
            return False
        self.open[client] += 1
        return True

    def release(self, client: str) -> None:
        self.open[client] -= 1
        if self.open[client] <= 0:
            del self.open[client]

    def closed(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.connections_closed.labels(reason).inc()


async def _without_server(headers: CIMultiDict[str]) -> None:
    """A response head's last change before it is serialized: no ``Server`` field."""
    headers.popall(hdrs.SERVER, None)


class _GuardedHandler(web.RequestHandler):
    """aiohttp's HTTP/1.1 protocol with the timeouts, limits and error answers of this module.

    It reads four attributes of its base class that aiohttp does not document: ``_request_count``
    and ``_messages`` (how many request heads were parsed, and those waiting to be handled, with
    their bodies), ``_close`` and ``_force_close`` (the connection is ending); and it wraps
    ``_request_factory`` (called with each request's new ``StreamWriter``) to set the writer's
    ``_on_headers_sent`` hook, which sees the head of every response, error answers included.
    The integration tests fail at once if a new aiohttp renames them.
    """

    def __init__(
        self, manager: web.Server, *, clients: _Clients, limits: ConnectionLimits, **kwargs: Any
    ) -> None:
        super().__init__(manager, **kwargs)
        self._clients = clients
        self._limits = limits
        self._client = "unknown"
        self._admitted = False
        self._head_bytes = 0  # of a head not complete yet
        self._outstanding = 0  # requests parsed and not answered yet
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._receiving_body: Any = None  # the StreamReader of a body still arriving
        make_request = self._request_factory
        assert make_request is not None

        def request_factory(
            message: Any, payload: Any, protocol: Any, writer: Any, task: Any
        ) -> web.BaseRequest:
            if isinstance(writer, StreamWriter):
                writer._on_headers_sent = _without_server
            return make_request(message, payload, protocol, writer, task)

        self._request_factory = request_factory

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self._client = str(peer[0]) if isinstance(peer, tuple | list) and peer else "unknown"
        if not self._clients.admit(self._client):
            log.info("refused a connection from %s: too many open connections", self._client)
            self._clients.closed(TOO_MANY_CONNECTIONS)
            # (uvloop's transports are not asyncio.WriteTransport subclasses: no isinstance)
            cast(asyncio.WriteTransport, transport).write(
                _raw_status(
                    429,
                    "TooManyRequests",
                    f"too many connections from {self._client}; try again later",
                    retry_after=RETRY_AFTER_SECONDS,
                )
            )
            transport.close()
            return
        self._admitted = True
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self._clients.release(self._client)
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._admitted or self._close or self._force_close:
            return
        in_body = self._receiving_body is not None and not self._receiving_body.is_eof()
        parsed = self._request_count
        super().data_received(data)
        parsed = self._request_count - parsed
        if parsed:
            self._head_bytes = 0
            self._outstanding += parsed
            self._cancel(self._head_timer)
            self._head_timer = None
            for _, payload in list(self._messages)[-parsed:]:
                if not payload.is_eof():
                    self._expect_body(payload)
        elif data and not in_body:  # (aiohttp calls this with b"" to reparse what it holds)
            # Bytes of a request head that is not complete yet. (If a body ended within
            # ``data``, what followed it is not counted: at worst until the next read.)
            self._head_bytes += len(data)
            if self._head_timer is None:
                self._arm_head_timer()
            if self._head_bytes > MAX_HEAD_BYTES:
                self._refuse_head()

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self._outstanding -= 1

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """The answer to a request aiohttp could not parse (``status`` 400) or whose handler
        raised (500, 504): a Status; the log names the error's class, never a byte received."""
        if not isinstance(exc, HttpProcessingError):  # the handler raised (500) or timed out
            log.error(
                "internal error serving %s %s from %s",
                request.method,
                request.path,
                self._client,
                exc_info=exc,
            )
            code, reason, text = status, "InternalError", "an internal error occurred"
        else:
            code, reason, text = _protocol_error(exc)
            log.info(
                "answered %d to a malformed request from %s: %s",
                code,
                self._client,
                type(exc).__name__,
            )
            self._clients.closed(MALFORMED)
        if request.writer.output_size > 0:  # aiohttp's rule: too late for another response
            raise ConnectionError("the response had started; cannot send another")
        response = web.Response(
            status=code,
            body=status_body(code=code, reason=reason, message=text),
            content_type="application/json",
            headers={"Connection": "close"},  # also on aiohttp's HTTP/1.0 error answers
        )
        response.force_close()
        return response

    # --- timers --------------------------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        self._head_timer = self._loop.call_later(self._limits.header_timeout, self._head_late)

    def _expect_body(self, payload: Any) -> None:
        self._cancel(self._body_timer)
        self._receiving_body = payload
        timer = self._loop.call_later(self._limits.body_timeout, self._body_late)
        self._body_timer = timer
        payload.on_eof(timer.cancel)

    def _head_late(self) -> None:
        self._head_timer = None
        self._close_for(HEADER_TIMEOUT, "request headers", self._limits.header_timeout)

    def _body_late(self) -> None:
        self._body_timer = None
        self._close_for(BODY_TIMEOUT, "the request body", self._limits.body_timeout)

    def _close_for(self, reason: str, what: str, seconds: float) -> None:
        if self.transport is None or self._force_close:
            return
        log.info(
            "closed the connection from %s: %s not complete within %gs", self._client, what, seconds
        )
        self._clients.closed(reason)
        self.force_close()

    def _refuse_head(self) -> None:
        log.info(
            "answered 431 to a request from %s: request head over %d bytes",
            self._client,
            MAX_HEAD_BYTES,
        )
        self._clients.closed(MALFORMED)
        if self._outstanding == 0 and self.transport is not None:  # no response under way
            self.transport.write(
                _raw_status(431, "BadRequest", "the request header fields are too large")
            )
        self.force_close()

    def _cancel_timers(self) -> None:
        self._cancel(self._head_timer)
        self._cancel(self._body_timer)
        self._head_timer = self._body_timer = None

    @staticmethod
    def _cancel(timer: asyncio.TimerHandle | None) -> None:
        if timer is not None:
            timer.cancel()


def _protocol_error(exc: BaseException | None) -> tuple[int, str, str]:
    """(code, Status reason, message) for an error of aiohttp's HTTP parser; the message is
    ours, never the parser's (which quotes the request)."""
    if isinstance(exc, LineTooLong):
        if exc.args[1:2] == (MAX_REQUEST_LINE,):
            return 414, "BadRequest", "the request line is too long"
        return 431, "BadRequest", "a request header field is too large"
    if isinstance(exc, BadHttpMessage) and exc.message == "Too many headers received":
        return 431, "BadRequest", "too many request header fields"
    return 400, "BadRequest", "malformed HTTP request"


def _raw_status(code: int, reason: str, message: str, *, retry_after: int | None = None) -> bytes:
    """A whole HTTP/1.1 response with a Status body, for where aiohttp has no request object."""
    body = status_body(code=code, reason=reason, message=message)
    head = [
        f"HTTP/1.1 {code} {HTTPStatus(code).phrase}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if retry_after is not None:
        head.append(f"Retry-After: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class GuardedSite(web.BaseSite):
    """A TCP listener (TLS with ``ssl_context``) serving a runner's app through
    :class:`_GuardedHandler`; the runner's other settings (cancellation, shutdown) apply."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        limits: ConnectionLimits,
        ssl_context: SSLContext | None = None,
        metrics: ServerMetrics | None = None,
        reuse_port: bool = False,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._host = host
        self._port = port
        self._reuse_port = reuse_port
        self._limits = limits
        self._clients = _Clients(limit=limits.max_connections_per_client, metrics=metrics)
        self._listener: asyncio.Server | None = None

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) listened on, once started (the port the OS chose for port 0)."""
        assert self._listener is not None, "not started"
        host, port = self._listener.sockets[0].getsockname()[:2]
        return str(host), int(port)

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        protocol = functools.partial(
            _GuardedHandler,
            server,
            clients=self._clients,
            limits=self._limits,
            loop=loop,
            access_log=None,
            keepalive_timeout=self._limits.idle_timeout,
            max_line_size=MAX_REQUEST_LINE,
            max_field_size=MAX_HEADER_FIELD,
            max_headers=MAX_HEADERS,
        )
        self._listener = self._server = await loop.create_server(
            protocol,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_port=self._reuse_port or None,
            ssl_handshake_timeout=self._limits.header_timeout if self._ssl_context else None,
        )


@contextlib.asynccontextmanager
async def listening(
    app: web.Application,
    host: str,
    port: int,
    *,
    limits: ConnectionLimits,
    ssl_context: SSLContext | None = None,
    metrics: ServerMetrics | None = None,
    shutdown_timeout: float = 60.0,
    reuse_port: bool = False,
) -> AsyncIterator[GuardedSite]:
    """Serve ``app`` on ``host:port`` until the block ends (then a graceful ``runner.cleanup``).

    ``handler_cancellation``: a client that goes away cancels its handler, which closes the
    upstream request at once instead of holding an idle watch open.
    ``shutdown_timeout``: how long the cleanup lets requests in flight finish before it cancels
    them (aiohttp waits for every connection's handler concurrently).
    ``reuse_port``: bind with ``SO_REUSEPORT``, beside the other workers of one server on the
    same port (:mod:`vwserver.workers`); the kernel spreads new connections across them.
    """
    scrub_aiohttp_logs()
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None, shutdown_timeout=shutdown_timeout
    )
    await runner.setup()
    try:
        site = GuardedSite(
            runner,
            host,
            port,
            limits=limits,
            ssl_context=ssl_context,
            metrics=metrics,
            reuse_port=reuse_port,
        )
        await site.start()
        yield site
    finally:
        await runner.cleanup()
