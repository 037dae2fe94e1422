"""What one write through a slice costs kcp: the proxy's upstream requests per verb.

Shared by the fake's and real kcp's tests (tests/security/test_write_cost.py,
tests/security/test_write_cost_kcp.py): :data:`WRITES` is the table of writes with the upstream
requests each costs when the shared cache has the object (``cached``) and when it does not
(``uncached``: a GET first); :func:`upstream_requests` reads vwserver's own count
(``vwserver_upstream_requests_total``); :func:`behind` makes the cache's copy of one object an
older version of it — a cache that has not seen a change yet — deterministically.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp

from tests.support.metrics import sample
from vwserver.cache.entries import Entry, Key
from vwserver.cache.registry import CacheRegistry
from vwserver.cache.shared import SharedResource

UPSTREAM = "vwserver_upstream_requests_total"
WIDGETS = "/apis/example.io/v1alpha1/widgets"
JSON = "application/json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"


@dataclass(frozen=True)
class Write:
    """One write of the widget ``name`` (``body(stored)``: what is sent, from its stored
    state); ``path``: after the object's URL ("" or "/status")."""

    name: str
    method: str
    content_type: str
    body: Callable[[dict[str, Any]], Any]
    cached: int
    uncached: int
    path: str = ""
    query: tuple[tuple[str, str], ...] = ()
    ok: tuple[int, ...] = (200,)


def _blind(stored: dict[str, Any]) -> dict[str, Any]:
    """The stored object without its resourceVersion (an update the proxy makes
    conditional)."""
    meta = {k: v for k, v in stored["metadata"].items() if k != "resourceVersion"}
    return {**stored, "metadata": meta, "spec": {**stored.get("spec", {}), "size": 7}}


def _apply(
    stored: dict[str, Any],
    *,
    status: dict[str, Any] | None = None,
    finalizers: list[str] | None = None,
    color: str = "blue",
) -> str:
    """An apply configuration of ``stored``: its spec's color (or, for the status
    subresource, ``status``), and ``finalizers`` if given."""
    meta = stored["metadata"]
    config: dict[str, Any] = {
        "apiVersion": stored["apiVersion"],
        "kind": stored["kind"],
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
    }
    if finalizers is not None:
        config["metadata"]["finalizers"] = finalizers
    if status is None:
        config["spec"] = {"color": color}
    else:
        config["status"] = status
    return json.dumps(config)


WRITES: tuple[Write, ...] = (
    Write("update", "PUT", JSON, _blind, 1, 2),
    Write("update with resourceVersion", "PUT", JSON, lambda s: s, 1, 2),
    Write("status update", "PUT", JSON, lambda s: {**s, "status": {"phase": "a"}}, 1, 2, "/status"),
    Write(
        "status merge patch", "PATCH", MERGE, lambda _: {"status": {"phase": "b"}}, 1, 2, "/status"
    ),
    Write(
        "status JSON patch",
        "PATCH",
        JSON_PATCH,
        lambda _: [{"op": "add", "path": "/status", "value": {"phase": "c"}}],
        1,
        2,
        "/status",
    ),
    Write(
        "status apply",
        "PATCH",
        APPLY,
        lambda s: _apply(s, status={"phase": "d"}),
        1,
        2,
        "/status",
        (("fieldManager", "cost"),),
    ),
    Write(
        "merge patch",
        "PATCH",
        MERGE,
        lambda _: {
            "metadata": {"labels": {"m": "x"}, "annotations": {"m": "y"}},
            "spec": {"size": 3},
        },
        1,
        2,
    ),
    Write(
        "JSON patch",
        "PATCH",
        JSON_PATCH,
        lambda _: [
            {"op": "replace", "path": "/spec/size", "value": 4},
            {"op": "add", "path": "/metadata/labels/j", "value": "x"},
        ],
        1,
        2,
    ),
    # An apply whose result stays in the slice whatever field ownership decides (no finalizer
    # or hold, labels inside the slice either way) needs no dry run: one write.
    Write("apply", "PATCH", APPLY, _apply, 1, 2, query=(("fieldManager", "cost"),)),
    Write("delete", "DELETE", JSON, lambda _: None, 1, 2, ok=(200, 202)),
)

APPLY_FINALIZER = Write(
    "apply of a finalizer",
    "PATCH",
    APPLY,
    lambda s: _apply(s, finalizers=["example.io/cost"]),
    2,
    3,
    query=(("fieldManager", "cost"),),
)
"""An apply whose result's holds the proxy must see (a finalizer it adds is recorded for the
slice): the dry run, then the write with the holds — two requests."""


def apply_config(stored: dict[str, Any], *, color: str) -> str:
    """An apply configuration of ``stored`` setting its spec's color."""
    return _apply(stored, color=color)


async def upstream_requests(session: aiohttp.ClientSession, base: str) -> float:
    """The requests vwserver at ``base`` sent to kcp so far (every method)."""
    return await sample(session, base, UPSTREAM)


async def send(
    session: aiohttp.ClientSession, url: str, write: Write, stored: dict[str, Any]
) -> tuple[int, Any]:
    body = write.body(stored)
    data = body if isinstance(body, str) or body is None else json.dumps(body)
    async with session.request(
        write.method,
        url + write.path,
        data=data,
        params=list(write.query),
        headers={"Content-Type": write.content_type},
    ) as resp:
        raw = await resp.read()
        return resp.status, json.loads(raw) if raw else None


async def cost(
    session: aiohttp.ClientSession, base: str, url: str, write: Write, stored: dict[str, Any]
) -> tuple[float, int, Any]:
    """The upstream requests ``write`` of the object at ``url`` cost vwserver at ``base``,
    with its answer."""
    before = await upstream_requests(session, base)
    status, doc = await send(session, url, write, stored)
    return await upstream_requests(session, base) - before, status, doc


def widgets_cache(registry: CacheRegistry) -> SharedResource:
    """The running shared resource of the widgets (objects, not Table rows)."""
    found = [r for r in registry.resources() if r.api_path == WIDGETS and not r.table]
    assert len(found) == 1, [r.api_path for r in registry.resources()]
    return found[0]


async def until_cached(
    registry: CacheRegistry, key: Key, *, newer_than: int = 0, within: float = 10.0
) -> Entry:
    """The cache's entry of ``key`` once it is newer than ``newer_than``."""
    async with asyncio.timeout(within):
        while True:
            entry = widgets_cache(registry).store.get(key)
            if entry is not None and entry.meta.resource_version > newer_than:
                return entry
            await asyncio.sleep(0.02)


def behind(registry: CacheRegistry, older: Entry) -> None:
    """Put ``older`` back in the cache in place of the current version of its object: the
    cache is then behind kcp for it, as a cache is until the watch event arrives."""
    store = widgets_cache(registry).store
    store.replace([older if e.key == older.key else e for e in store.snapshot()], store.rv)


@contextlib.contextmanager
def stream_paused(registry: CacheRegistry) -> Iterator[None]:
    """The widgets cache's stream held back: its events and bookmarks are kept, not applied,
    until the block ends (then applied in order) — a cache behind kcp, as it is for the
    milliseconds before a write's event arrives, for as long as the test needs."""
    resource = widgets_cache(registry)
    held: list[tuple[str, Any]] = []
    resource.on_event = lambda kind, item: held.append((kind, item))  # type: ignore[method-assign]
    resource.on_bookmark = lambda rv: held.append(("BOOKMARK", rv))  # type: ignore[method-assign]
    try:
        yield
    finally:
        del resource.on_event, resource.on_bookmark
        for kind, item in held:
            if kind == "BOOKMARK":
                resource.on_bookmark(item)
            else:
                resource.on_event(kind, item)
