"""A small asyncio Kubernetes REST client for vwserver's own controllers.

The proxy forwards other clients' requests and therefore has its own, streaming-first client
(:mod:`vwserver.proxy.upstream`). The embedded controller instead *reads* objects: GET, LIST,
WATCH and status patches of a handful of kinds, decoded as JSON. This module is that client —
deliberately tiny (no discovery, no caching), with errors mapped onto the project's exception
hierarchy so callers can tell "not found" from "try again later".
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

import aiohttp
import msgspec
from yarl import URL

from vwserver.errors import UpstreamUnavailable, VWServerError
from vwserver.k8s.kubeconfig import ClientAuth

# A watch line may hold an object of up to etcd's limit plus the event envelope.
MAX_EVENT_BYTES = 4 * 2**20

JSON = dict[str, Any]


class ApiError(VWServerError):
    """A non-2xx answer from the API server, with its code and Status body."""

    def __init__(self, *, code: int, body: bytes, url: str) -> None:
        status = _decode_status(body)
        self.code = code
        self.reason = str(status.get("reason", ""))
        self.message = str(status.get("message", body[:200].decode(errors="replace")))
        super().__init__(f"{code} {self.reason or 'error'} from {url}: {self.message}")

    @property
    def transient(self) -> bool:
        """Worth retrying later (server-side trouble, throttling, timeouts)."""
        return self.code in (408, 429) or self.code >= 500


def _decode_status(body: bytes) -> dict[str, Any]:
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}


class KubeClient:
    """Requests against one API server (``auth.server``'s origin) with one identity."""

    def __init__(self, *, auth: ClientAuth, timeout: float = 30.0) -> None:
        self._auth = auth
        scheme, _, rest = auth.server.partition("://")
        self.origin = f"{scheme}://{rest.split('/', 1)[0]}"
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> KubeClient:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._auth.ssl_context()),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._timeout),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def url(self, path: str) -> str:
        """An absolute URL for ``path`` (``/clusters/...``) on this server, or ``path`` as is."""
        return path if "://" in path else f"{self.origin}{path}"

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        token = self._auth.bearer_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Iterable[tuple[str, str]] = (),
        body: object = None,
        content_type: str = "application/json",
    ) -> JSON:
        """One request; the decoded JSON answer. Raises ApiError / UpstreamUnavailable."""
        assert self._session is not None, "use 'async with KubeClient(...)'"
        url = URL(self.url(path), encoded=True)
        query = list(query)
        if query:
            url = url.with_query(query)
        data = None if body is None else msgspec.json.encode(body)
        try:
            async with self._session.request(
                method,
                url,
                data=data,
                headers=self._headers(content_type if data is not None else None),
                timeout=aiohttp.ClientTimeout(total=self._timeout),
            ) as response:
                raw = await response.read()
                if response.status >= 300:
                    raise ApiError(code=response.status, body=raw, url=str(url))
        except (aiohttp.ClientConnectionError, TimeoutError) as e:
            raise UpstreamUnavailable(f"{url.host}:{url.port} unreachable: {e!r}") from e
        doc = msgspec.json.decode(raw) if raw else {}
        if not isinstance(doc, dict):
            raise ApiError(code=502, body=b"", url=str(url))
        return doc

    async def get(self, path: str) -> JSON | None:
        """GET one object; None when it does not exist (404)."""
        try:
            return await self.request("GET", path)
        except ApiError as e:
            if e.code == 404:
                return None
            raise

    async def watch(
        self, path: str, *, query: Iterable[tuple[str, str]] = ()
    ) -> AsyncIterator[JSON]:
        """The events of one watch request until the server ends it. Raises ApiError if the
        watch is refused (e.g. 410 Gone for an expired resourceVersion)."""
        assert self._session is not None, "use 'async with KubeClient(...)'"
        url = URL(self.url(path), encoded=True).with_query([*query, ("watch", "true")])
        try:
            async with self._session.get(
                url, headers=self._headers(), timeout=aiohttp.ClientTimeout(total=None)
            ) as response:
                if response.status != 200:
                    raise ApiError(code=response.status, body=await response.read(), url=str(url))
                buffer = bytearray()
                async for chunk in response.content.iter_any():
                    buffer += chunk
                    while (end := buffer.find(b"\n")) != -1:
                        line = bytes(buffer[: end + 1])
                        del buffer[: end + 1]
                        if line.strip():
                            event = msgspec.json.decode(line)
                            if isinstance(event, dict):
                                yield event
                    if len(buffer) > MAX_EVENT_BYTES:
                        raise ApiError(code=502, body=b"", url=str(url))
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as e:
            raise UpstreamUnavailable(f"watch {url.host}:{url.port} broke: {e!r}") from e
