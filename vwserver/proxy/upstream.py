"""The one HTTP client to the upstream APIExport virtual workspace.

vwserver talks to kcp with *its own* identity: the request headers a
client sent are not forwarded wholesale but picked from an allow-list, so hop-by-hop headers
(RFC 9110 §7.6.1), the client's ``Authorization`` and every ``Impersonate-*`` / ``X-Remote-*``
header (which kcp would honour as an authenticating-proxy identity) can never reach kcp.

Connection failures become :class:`~vwserver.errors.UpstreamUnreachable` (503 + Retry-After) so
that clients back off and retry instead of failing hard.
"""

from __future__ import annotations

import copy
import ssl
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from vwserver.errors import UpstreamUnreachable
from vwserver.k8s.kubeconfig import ClientAuth

# Client request headers worth forwarding; everything else is dropped. Accept and Content-Type
# are set by the proxy from what it parsed (vwserver.proxy.negotiation), never copied.
_FORWARDED_REQUEST_HEADERS = ("User-Agent",)
# Upstream response headers a client may see; everything else (Set-Cookie, hop-by-hop,
# Content-Length of a body we may change, priority-and-fairness internals) is dropped.
FORWARDED_RESPONSE_HEADERS = ("Content-Type", "Warning", "Audit-Id", "Cache-Control")

RETRY_AFTER_SECONDS = 1


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
        # Set on views made by for_caller() only.
        self._caller_token: str | None = None
        self._request_ssl: ssl.SSLContext | bool = True  # True: the connector's context
        self._caller_ssl: ssl.SSLContext | bool = True
        if auth.client_cert_pem:
            anonymous = replace(auth, client_cert_pem=None, client_key_pem=None).ssl_context()
            if isinstance(anonymous, ssl.SSLContext):
                self._caller_ssl = anonymous

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
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @asynccontextmanager
    async def request(
        self,
        method: str,
        url: str,
        *,
        query: Iterable[tuple[str, str]] = (),
        headers: CIMultiDict[str] | None = None,
        data: bytes | None = None,
        read_timeout: float | None = 60.0,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Send one request; connection failures raise UpstreamUnreachable."""
        assert self._session is not None, "UpstreamClient.start() was not awaited"
        target = URL(url, encoded=True)
        query = list(query)
        if query:
            target = target.with_query(query)
        send_headers: CIMultiDict[str] = CIMultiDict(headers or {})
        token = self._caller_token or self._auth.bearer_token()
        if token:
            send_headers["Authorization"] = f"Bearer {token}"
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self._connect_timeout, sock_read=read_timeout
        )
        try:
            async with self._session.request(
                method,
                target,
                headers=send_headers,
                data=data,
                timeout=timeout,
                ssl=self._request_ssl,
            ) as response:
                yield response
        except (aiohttp.ClientConnectionError, TimeoutError) as e:
            raise UpstreamUnreachable(
                f"upstream {target.host}:{target.port} unreachable: {type(e).__name__}",
                retry_after=RETRY_AFTER_SECONDS,
            ) from e
