"""A small asyncio Kubernetes REST client for vwserver's own control loops.

The proxy forwards other clients' requests and therefore has its own, streaming-first client
(:mod:`vwserver.proxy.upstream`). The slice controller, the syncer, leader election and the
reviews instead *read and write* objects of a handful of kinds, decoded as JSON. This module is
that client — deliberately tiny (no discovery, no caching; list+watch loops are
:mod:`vwserver.k8s.reflector`'s) — with every failure one of two kinds:

* :class:`~vwserver.errors.ApiError` — the server answered, and refused: the subclass says how
  (``ApiNotFound``, ``ApiConflict``, ``ApiGone``, …, built by :func:`~vwserver.errors.api_error`
  from the answer's Status; a watch's ``ERROR`` event too);
* :class:`~vwserver.errors.UpstreamUnavailable` — no usable answer (connection refused or broken,
  timed out, a watch that fell silent).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Iterable
from typing import Any, TypeVar

import aiohttp
import msgspec
from yarl import URL

from vwserver.errors import (
    ApiError,
    ApiNotFound,
    EventTooLarge,
    UpstreamUnavailable,
    WatchSilent,
    api_error,
)
from vwserver.k8s import framing, kcp
from vwserver.k8s.kubeconfig import ClientAuth

__all__ = ["JSON", "MERGE_PATCH", "ApiError", "KubeClient", "RawEvent"]  # ApiError: raised

JSON = dict[str, Any]
T = TypeVar("T")

MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


def _decode_status(body: bytes) -> dict[str, Any]:
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _unusable(url: object, what: str) -> ApiError:
    """An answer that is no Kubernetes answer: a 502, retried like any server failure."""
    return api_error(502, {"reason": "BadGateway", "message": what}, url=str(url))


class KubeClient:
    """Requests against one API server (``auth.server``'s origin) with one identity."""

    def __init__(
        self, *, auth: ClientAuth, timeout: float = 30.0, max_connections: int = 100
    ) -> None:
        """``max_connections``: of this client's one connection pool (aiohttp's limit is per
        session; open watches hold a connection each)."""
        self._auth = auth
        self.origin = kcp.origin(auth.server)
        self._timeout = timeout
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> KubeClient:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                ssl=self._auth.ssl_context(), limit=self._max_connections
            ),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._timeout),
        )
        return self

    @property
    def connections(self) -> int:
        """Connections of this client's pool open now (in use or idle), for ``/metrics``."""
        if self._session is None:
            return 0
        connector = self._session.connector
        if connector is None:
            return 0
        # aiohttp keeps the acquired ones in ``_acquired`` and the idle ones per host in
        # ``_conns``; neither is public API, so a change of aiohttp reads as 0, never raises.
        acquired = len(getattr(connector, "_acquired", ()))
        idle = sum(len(v) for v in getattr(connector, "_conns", {}).values())
        return acquired + idle

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def url(self, path: str) -> str:
        """An absolute URL for ``path`` (``/clusters/...``) on this server, or ``path`` as is."""
        return path if "://" in path else f"{self.origin}{path}"

    def _headers(
        self, content_type: str | None = None, *, accept: str = "application/json"
    ) -> dict[str, str]:
        headers = {"Accept": accept}
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
        url, raw = await self._exchange(method, path, query, body, content_type)
        try:
            doc = msgspec.json.decode(raw) if raw else {}
        except msgspec.DecodeError as e:
            raise _unusable(url, f"undecodable answer: {e}") from e
        if not isinstance(doc, dict):
            raise _unusable(url, "the answer is no JSON object")
        return doc

    async def request_raw(
        self,
        method: str,
        path: str,
        *,
        query: Iterable[tuple[str, str]] = (),
        accept: str = "application/json",
    ) -> bytes:
        """One request without a body; the answer's bytes as they came (raw mode: the caller
        decodes only what it needs, e.g. a list page's items as ``msgspec.Raw``), in the
        representation ``accept`` names (e.g. a ``meta.k8s.io`` Table). Raises ApiError /
        UpstreamUnavailable like :meth:`request`."""
        _, raw = await self._exchange(method, path, query, None, "application/json", accept)
        return raw

    async def _exchange(
        self,
        method: str,
        path: str,
        query: Iterable[tuple[str, str]],
        body: object,
        content_type: str,
        accept: str = "application/json",
    ) -> tuple[URL, bytes]:
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
                headers=self._headers(content_type if data is not None else None, accept=accept),
                timeout=aiohttp.ClientTimeout(total=self._timeout),
            ) as response:
                raw = await response.read()
                if response.status >= 300:
                    raise api_error(response.status, _decode_status(raw), url=str(url), body=raw)
        except (aiohttp.ClientConnectionError, TimeoutError) as e:
            raise UpstreamUnavailable(f"{url.host}:{url.port} unreachable: {e!r}") from e
        return url, raw

    async def get(self, path: str) -> JSON | None:
        """GET one object; None when it does not exist (404)."""
        try:
            return await self.request("GET", path)
        except ApiNotFound:
            return None

    async def merge_patch(
        self, path: str, patch: JSON, *, field_manager: str | None = None
    ) -> JSON:
        """A JSON merge patch (RFC 7386); ``metadata.resourceVersion`` in it makes it
        conditional; ``field_manager``: the name ``managedFields`` records the change under."""
        query = [("fieldManager", field_manager)] if field_manager else []
        return await self.request("PATCH", path, query=query, body=patch, content_type=MERGE_PATCH)

    async def apply(self, path: str, obj: JSON, *, field_manager: str, force: bool = True) -> JSON:
        """Server-side apply (``force``: take over fields another manager set)."""
        query = [("fieldManager", field_manager)]
        if force:
            query.append(("force", "true"))
        return await self.request("PATCH", path, query=query, body=obj, content_type=APPLY_PATCH)

    async def delete(self, path: str, *, uid: str | None = None) -> None:
        """Delete (background propagation), only if the object still has ``uid``."""
        body: JSON = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": "Background",
        }
        if uid:
            body["preconditions"] = {"uid": uid}
        await self.request("DELETE", path, body=body)

    def watch(
        self,
        path: str,
        *,
        query: Iterable[tuple[str, str]] = (),
        idle_timeout: float | None = None,
        on_answer: Callable[[], None] | None = None,
    ) -> AsyncGenerator[JSON, None]:
        """The events of one watch request (``watch=true`` is added) until the server ends it:
        ``{"type": ADDED | MODIFIED | DELETED | BOOKMARK, "object": {...}}``.

        A refused watch, and an ``ERROR`` event (410 Gone for an expired resourceVersion, …),
        raise their :class:`ApiError`; an undecodable or oversized event, or one of an unknown
        type, an ``ApiServerError`` (502). With ``idle_timeout``, a stream that sends nothing for
        that long raises :class:`WatchSilent`, and a watch not answered within
        ``min(idle_timeout, WATCH_ANSWER_WITHIN)`` (no response headers) UpstreamUnavailable,
        like a broken connection. ``on_answer`` is called when the server has accepted the
        watch (``200``, before any event): the upstream is reachable again.
        """
        return self._watch(
            path, query=query, idle_timeout=idle_timeout, decode=_event, on_answer=on_answer
        )

    def watch_raw(
        self,
        path: str,
        *,
        query: Iterable[tuple[str, str]] = (),
        idle_timeout: float | None = None,
        accept: str = "application/json",
        on_answer: Callable[[], None] | None = None,
    ) -> AsyncGenerator[RawEvent, None]:
        """:meth:`watch` in raw mode: each event's type, and its object as the bytes it came
        as (``msgspec.Raw``; in the representation ``accept`` names), for callers that decode
        each object once, themselves. Errors as in :meth:`watch`; an event whose object is no
        JSON object is a 502 too."""
        return self._watch(
            path,
            query=query,
            idle_timeout=idle_timeout,
            decode=_raw_event,
            accept=accept,
            on_answer=on_answer,
        )

    async def _watch(
        self,
        path: str,
        *,
        query: Iterable[tuple[str, str]],
        idle_timeout: float | None,
        decode: Callable[[bytes | bytearray, URL], T],
        accept: str = "application/json",
        on_answer: Callable[[], None] | None = None,
    ) -> AsyncGenerator[T, None]:
        assert self._session is not None, "use 'async with KubeClient(...)'"
        url = URL(self.url(path), encoded=True).with_query([*query, ("watch", "true")])
        timeout = aiohttp.ClientTimeout(total=None, sock_read=idle_timeout)
        answer_within = _watch_answer_within(idle_timeout)
        answered = False
        try:
            headers = self._headers(accept=accept)
            # An apiserver sends a watch's response headers as soon as the watch is set up (it
            # flushes them before the first event); an upstream that has not answered by then
            # is unreachable (a stalled connection), whatever the stream's silence limit.
            async with asyncio.timeout(answer_within):
                response = await self._session.get(url, headers=headers, timeout=timeout)
            async with response:
                answered = True
                if response.status != 200:
                    raw = await response.read()
                    raise api_error(response.status, _decode_status(raw), url=str(url), body=raw)
                if on_answer is not None:
                    on_answer()
                buffer = bytearray()
                async for chunk in response.content.iter_any():
                    buffer += chunk
                    end = framing.complete(buffer)
                    events = [buffer[start:stop] for start, stop in framing.lines(buffer, end)]
                    del buffer[:end]
                    for event in events:
                        yield decode(event, url)
        except EventTooLarge as e:
            raise _unusable(url, str(e)) from e
        except aiohttp.ServerTimeoutError as e:
            if answered:
                raise WatchSilent(f"watch {url.path}: nothing for {idle_timeout:g}s") from e
            raise UpstreamUnavailable(f"watch {url.path}: no answer in {idle_timeout:g}s") from e
        except TimeoutError as e:
            if answered:  # a TimeoutError of the stream itself: the connection broke
                raise UpstreamUnavailable(f"watch {url.host}:{url.port} broke: {e!r}") from e
            raise UpstreamUnavailable(f"watch {url.path}: no answer in {answer_within:g}s") from e
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
            raise UpstreamUnavailable(f"watch {url.host}:{url.port} broke: {e!r}") from e


#: The longest wait for a watch's response headers (see :meth:`KubeClient._watch`).
WATCH_ANSWER_WITHIN = 30.0


def _watch_answer_within(idle_timeout: float | None) -> float:
    if idle_timeout is None:
        return WATCH_ANSWER_WITHIN
    return min(idle_timeout, WATCH_ANSWER_WITHIN)


_EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK"})


def _event(line: bytes | bytearray, url: URL) -> JSON:
    """One decoded watch event; an ``ERROR`` event raises its Status as :class:`ApiError`."""
    try:
        event = msgspec.json.decode(line)
    except msgspec.DecodeError as e:
        raise _unusable(url, f"undecodable watch event: {e}") from e
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
        raise _unusable(url, "a watch event that is no object")
    kind = event.get("type")
    if kind == "ERROR":
        status = event["object"]
        raise api_error(int(status.get("code") or 500), status, url=str(url))
    if kind not in _EVENT_TYPES:
        raise _unusable(url, f"unknown watch event type {kind!r}")
    return event


class RawEvent(msgspec.Struct):
    """A watch event in raw mode (:meth:`KubeClient.watch_raw`): ``type`` is ADDED, MODIFIED,
    DELETED or BOOKMARK; ``object`` the object's JSON, undecoded."""

    type: str
    object: msgspec.Raw


_decode_raw_event = msgspec.json.Decoder(RawEvent).decode


def _raw_event(line: bytes | bytearray, url: URL) -> RawEvent:
    """One watch event in raw mode; an ``ERROR`` event raises its Status as :class:`ApiError`."""
    try:
        event = _decode_raw_event(line)
    except msgspec.DecodeError as e:
        raise _unusable(url, f"undecodable watch event: {e}") from e
    # msgspec.Raw holds exactly the value's bytes: an object starts with "{".
    if bytes(memoryview(event.object)[:1]) != b"{":
        raise _unusable(url, "a watch event that is no object")
    if event.type == "ERROR":
        status = _decode_status(bytes(event.object))
        raise api_error(int(status.get("code") or 500), status, url=str(url))
    if event.type not in _EVENT_TYPES:
        raise _unusable(url, f"unknown watch event type {event.type!r}")
    return event
