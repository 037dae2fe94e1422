"""The syncer's Kubernetes calls, on the project's one REST client (:mod:`vwserver.k8s.client`).

The syncer addresses two API servers (kcp through an APIExport or filtered endpoint, and the
downstream cluster) with generic JSON objects. :class:`vwserver.k8s.client.KubeClient` does the
HTTP, credentials and error mapping (``ApiError`` with the Status code/reason,
``UpstreamUnavailable`` for connection failures); this module adds what the syncer needs on top:

* :class:`ResourceType` — URLs of a resource under any base URL (``<vw>/clusters/<id>``, a
  downstream server that may itself end in ``/clusters/<workspace>``); URLs are used as given, so
  ``clusters/*`` stays a literal ``*``;
* paged LIST (one consistent snapshot), server-side apply with a field manager, merge patch,
  DELETE with a uid precondition;
* a watch that the server ends after ``timeoutSeconds`` and that we end ourselves if no event
  (not even a bookmark) arrives for longer than that: a silently dead connection would otherwise
  block an informer forever.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec

from vwserver.errors import UpstreamUnavailable
from vwserver.k8s.client import JSON, ApiError, KubeClient

MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


@dataclass(frozen=True, slots=True)
class ListResult:
    items: list[JSON]
    resource_version: str


async def list_all(
    client: KubeClient, url: str, *, label_selector: str | None = None, page_size: int = 500
) -> ListResult:
    """All items of a collection, paged with ``limit``/``continue``: every page is served from
    the first page's snapshot, so the result is consistent at its resourceVersion."""
    items: list[JSON] = []
    token = ""
    while True:
        query = [("limit", str(page_size))]
        if label_selector:
            query.append(("labelSelector", label_selector))
        if token:
            query.append(("continue", token))
        page = await client.request("GET", url, query=query)
        items.extend(page.get("items") or [])
        meta = page.get("metadata") or {}
        token = meta.get("continue") or ""
        if not token:
            return ListResult(items=items, resource_version=str(meta.get("resourceVersion", "")))


async def watch(
    client: KubeClient,
    url: str,
    *,
    resource_version: str,
    label_selector: str | None = None,
    timeout_seconds: int = 300,
) -> AsyncIterator[JSON]:
    """Watch events from ``resource_version`` (with bookmarks). An ``ERROR`` event (410 Gone
    included) is raised as :class:`ApiError`; an idle stream as UpstreamUnavailable."""
    query = [
        ("resourceVersion", resource_version),
        ("allowWatchBookmarks", "true"),
        ("timeoutSeconds", str(timeout_seconds)),
    ]
    if label_selector:
        query.append(("labelSelector", label_selector))
    events = client.watch(url, query=query)
    idle = timeout_seconds + 60.0
    try:
        while True:
            try:
                # asyncio.timeout, not wait_for: wait_for would drive the generator from another
                # task, and a cancellation racing with it can leave aclose() below waiting.
                async with asyncio.timeout(idle):
                    event = await anext(events)
            except StopAsyncIteration:
                return
            except TimeoutError as e:
                raise UpstreamUnavailable(f"watch {url}: no event for {idle:.0f}s") from e
            if event.get("type") == "ERROR":
                status = event.get("object") or {}
                raise ApiError(
                    code=int(status.get("code") or 500), body=msgspec.json.encode(status), url=url
                )
            yield event
    finally:
        await events.aclose()  # type: ignore[attr-defined]


async def apply(
    client: KubeClient, url: str, obj: JSON, *, field_manager: str, force: bool = True
) -> JSON:
    """Server-side apply (``force``: take over fields another manager set)."""
    query = [("fieldManager", field_manager)]
    if force:
        query.append(("force", "true"))
    return await client.request("PATCH", url, query=query, body=obj, content_type=APPLY_PATCH)


async def merge_patch(client: KubeClient, url: str, patch: JSON) -> JSON:
    return await client.request("PATCH", url, body=patch, content_type=MERGE_PATCH)


async def delete(client: KubeClient, url: str, *, uid: str | None = None) -> None:
    """Delete (background propagation), only if the object still has ``uid``."""
    body: JSON = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
    if uid:
        body["preconditions"] = {"uid": uid}
    await client.request("DELETE", url, body=body)
