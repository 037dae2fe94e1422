"""The one HTTP client to the upstream APIExport virtual workspace.

vwserver talks to kcp with *its own* identity: the request headers a
client sent are not forwarded wholesale but picked from an allow-list, so hop-by-hop headers
(RFC 9110 §7.6.1), the client's ``Authorization`` and every ``Impersonate-*`` / ``X-Remote-*``
header (which kcp would honour as an authenticating-proxy identity) can never reach kcp. (A
request carrying the latter is refused before it gets here,
:func:`vwserver.proxy.request_headers.refuse_impersonation`; the allow-list is the second line.)

Connection failures become :class:`~vwserver.errors.UpstreamUnreachable` (503 + Retry-After) so
that clients back off and retry instead of failing hard.

A GET read whole (:meth:`UpstreamClient.fetch`, one object) goes over the proxy's own keep-alive
connections (:mod:`vwserver.proxy.connections`) rather than aiohttp's client: it is the most
frequent upstream request, and aiohttp's general client machinery (request and response
objects, stream readers, timers, cookie and trace hooks) was about a third of the proxy's CPU
time per GET. Streams (lists, watches, discovery) and writes use the aiohttp session.
"""

from __future__ import annotations

import copy
import ssl
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from types import TracebackType
from typing import Literal

import aiohttp
from aiohttp.http import SERVER_SOFTWARE
from multidict import CIMultiDict
from yarl import URL

from vwserver.errors import BadGateway, BadRequest, UpstreamUnreachable
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.proxy.connections import RETRY_AFTER_SECONDS, ConnectionPool, Fetched
from vwserver.proxy.http1 import InvalidField, request_head

# Client request headers worth forwarding; everything else is dropped. Accept and Content-Type
# are set by the proxy from what it parsed (vwserver.proxy.negotiation), never copied.
_FORWARDED_REQUEST_HEADERS = ("User-Agent",)
# Upstream response headers a client may see; everything else (Set-Cookie, hop-by-hop,
# Content-Length of a body we may change, priority-and-fairness internals) is dropped.
FORWARDED_RESPONSE_HEADERS = ("Content-Type", "Warning", "Audit-Id", "Cache-Control")

# Largest upstream body the proxy reads whole: one LIST page, one object (etcd's 1.5 MiB default,
# up to 3 MiB as the issue requires), or a Status. Pages are bounded by the page size.
MAX_BODY = 64 * 2**20


def forwarded_headers(
    client: Mapping[str, str], *, accept: str, content_type: str | None = None
) -> CIMultiDict[str]:
    headers: CIMultiDict[str] = CIMultiDict()
    for name in _FORWARDED_REQUEST_HEADERS:
        value = client.get(name)
        if value is not None:
            headers[name] = value
    headers["Accept"] = accept
    if content_type is not None:
        headers["Content-Type"] = content_type
    return headers


class UpstreamClient:
    """An aiohttp session bound to vwserver's upstream credentials."""

    def __init__(self, *, auth: ClientAuth, connect_timeout: float = 10.0) -> None:
        self._auth = auth
        self._ssl = auth.ssl_context()
        self._connect_timeout = connect_timeout
        self._session: aiohttp.ClientSession | None = None
        # Timeouts are immutable: one per read timeout, not one per request.
        self._timeouts: dict[float | None, aiohttp.ClientTimeout] = {}
        self._pool = ConnectionPool(connect_timeout=connect_timeout)
        self._count: Callable[[str], None] | None = None
        # Set on views made by for_caller() only.
        self._caller_token: str | None = None
        self._request_ssl: ssl.SSLContext | bool = True  # True: the connector's context
        self._caller_ssl: ssl.SSLContext | bool = True
        if auth.client_cert_pem:
            anonymous = replace(auth, client_cert_pem=None, client_key_pem=None).ssl_context()
            if isinstance(anonymous, ssl.SSLContext):
                self._caller_ssl = anonymous

    def count_requests(self, count: Callable[[str], None]) -> None:
        """Call ``count(method)`` for every request sent from now on, also through the views
        :meth:`for_caller` makes (the server's ``vwserver_upstream_requests``)."""
        self._count = count

    def for_caller(self, token: str) -> UpstreamClient:
        """A view that sends the caller's ``token`` instead of vwserver's credentials
        (``auth.mode: passthrough``), for one request.

        It shares this client's session: do not start or close it. Its TLS connections carry no
        client certificate even when vwserver's identity is one, or kcp would authenticate
        vwserver by it (the apiserver tries x509 before bearer tokens); aiohttp pools
        connections per TLS context, so they are never mixed with vwserver's own.
        """
        view = copy.copy(self)
        view._caller_token = token
        view._request_ssl = self._caller_ssl
        return view

    async def start(self) -> None:
        self._pool = ConnectionPool(connect_timeout=self._connect_timeout)  # also after close()
        connector = aiohttp.TCPConnector(ssl=self._ssl, limit=0, limit_per_host=0)
        self._session = aiohttp.ClientSession(
            connector=connector,
            # Bodies are streamed and checked by the proxy; it decompresses what it reads
            # itself (gzip is re-applied towards the client when the client accepts it).
            auto_decompress=True,
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=self._connect_timeout, connect=self._connect_timeout
            ),
            # Watch events may hold objects up to 3 MiB (etcd's limit); the proxy frames lines
            # itself, this only sizes the read buffer.
            read_bufsize=2**18,
            skip_auto_headers=("Accept-Encoding",),
            # The session is shared by every caller (passthrough mode sends each one's token):
            # a cookie the upstream sets must not be sent back with anyone else's request. kcp
            # sets none, so not keeping them also saves a cookie-jar pass per request.
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def close(self) -> None:
        self._pool.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def fetch(
        self,
        url: str,
        *,
        query: Iterable[tuple[str, str]] = (),
        headers: CIMultiDict[str] | None = None,
        read_timeout: float | None = 60.0,
    ) -> Fetched:
        """GET ``url`` and read the whole answer, whatever its status (a body over
        :data:`MAX_BODY` is a BadGateway); connection failures raise UpstreamUnreachable."""
        assert self._session is not None, "UpstreamClient.start() was not awaited"
        target = URL(url, encoded=True)
        query = list(query)
        if query:
            target = target.with_query(query)
        tls = self._tls_for(target)
        if tls is False:
            async with self.request("GET", url, query=query, headers=headers) as up:
                return Fetched(up.status, up.headers, await read_body(up))
        fields: CIMultiDict[str] = CIMultiDict(headers or ())
        fields.popall("Host", None)  # the URL's, written by request_head
        fields.setdefault("User-Agent", SERVER_SOFTWARE)  # what aiohttp sends by default
        # Only identity: the proxy reads what it forwards (a compressed answer is refused).
        fields["Accept-Encoding"] = "identity"
        token = self._caller_token or self._auth.bearer_token()
        if token:
            fields["Authorization"] = f"Bearer {token}"
        host, port = target.raw_host, target.port
        assert host is not None
        assert port is not None
        try:
            request = request_head(
                target=target.raw_path_qs,
                host=target.host_port_subcomponent or host,
                fields=fields.items(),
            )
        except InvalidField as e:
            raise BadRequest(f"the {e.name} header cannot be sent upstream") from e
        if self._count is not None:
            self._count("GET")
        return await self._pool.get(
            host=host,
            port=port,
            tls=tls,
            request=request,
            read_timeout=read_timeout,
            limit=MAX_BODY,
        )

    def _tls_for(self, target: URL) -> ssl.SSLContext | Literal[False] | None:
        """The TLS context of a :meth:`fetch` of ``target`` (None: plain http); False where
        only the aiohttp session knows what to do (an https URL without a context of vwserver's
        own, a URL with credentials in it)."""
        if target.raw_user is not None or target.raw_password is not None:
            return False
        if target.scheme == "http":
            return None
        if target.scheme != "https":
            return False
        tls = self._request_ssl if isinstance(self._request_ssl, ssl.SSLContext) else self._ssl
        return tls if isinstance(tls, ssl.SSLContext) else False

    def request(
        self,
        method: str,
        url: str,
        *,
        query: Iterable[tuple[str, str]] = (),
        headers: CIMultiDict[str] | None = None,
        data: bytes | None = None,
        read_timeout: float | None = 60.0,
    ) -> UpstreamRequest:
        """Send one request (``async with client.request(...) as response``); connection
        failures, also while the body is read inside the block, raise UpstreamUnreachable."""
        session = self._session
        assert session is not None, "UpstreamClient.start() was not awaited"
        target = URL(url, encoded=True)
        query = list(query)
        if query:
            target = target.with_query(query)
        send_headers: CIMultiDict[str] = CIMultiDict(headers or ())
        token = self._caller_token or self._auth.bearer_token()
        if token:
            send_headers["Authorization"] = f"Bearer {token}"
        timeout = self._timeouts.get(read_timeout)
        if timeout is None:
            timeout = self._timeouts[read_timeout] = aiohttp.ClientTimeout(
                total=None, sock_connect=self._connect_timeout, sock_read=read_timeout
            )
        if self._count is not None:
            self._count(method)
        sending = session.request(
            method,
            target,
            headers=send_headers,
            data=data,
            timeout=timeout,
            ssl=self._request_ssl,
        )
        return UpstreamRequest(sending, target)


class UpstreamRequest:
    """One upstream request as an async context manager: the response while the block runs,
    its connection released after; connection failures become UpstreamUnreachable.

    A class rather than ``@asynccontextmanager``: every proxied request enters one, and a
    generator-based context manager costs a generator, its frame and ``athrow`` on errors.
    """

    __slots__ = ("_sending", "_target")

    def __init__(
        self, sending: AbstractAsyncContextManager[aiohttp.ClientResponse], target: URL
    ) -> None:
        self._sending = sending
        self._target = target

    async def __aenter__(self) -> aiohttp.ClientResponse:
        try:
            return await self._sending.__aenter__()
        except (aiohttp.ClientConnectionError, TimeoutError) as e:
            raise self._unreachable(e) from e

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self._sending.__aexit__(exc_type, exc, tb)
        except (aiohttp.ClientConnectionError, TimeoutError) as e:
            raise self._unreachable(e) from e
        if isinstance(exc, aiohttp.ClientConnectionError | TimeoutError):
            raise self._unreachable(exc) from exc

    def _unreachable(self, error: BaseException) -> UpstreamUnreachable:
        target = self._target
        return UpstreamUnreachable(
            f"upstream {target.host}:{target.port} unreachable: {type(error).__name__}",
            retry_after=RETRY_AFTER_SECONDS,
        )


async def read_body(upstream: aiohttp.ClientResponse, *, limit: int = MAX_BODY) -> bytes:
    """Read a whole upstream body, refusing absurd sizes instead of growing without bound."""
    content = upstream.content
    chunks: list[bytes] = []
    size = 0
    # readany() itself rather than ``async for``: one fewer object and await per chunk, and a
    # small body (one object) is usually one chunk.
    while chunk := await content.readany():
        size += len(chunk)
        if size > limit:
            raise BadGateway(f"upstream response larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
