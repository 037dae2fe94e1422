"""Measure what can prove the shared cache current for a consistent read, against a running kcp.

    KCP_KUBECONFIG=.../admin.kubeconfig python scripts/kcp/freshness_signals.py [PROBES]

Bootstraps the demo world on that kcp (idempotent), then:

1. **Two watches are not ordered with each other.** A reflector-like watch of the export's
   widgets (``clusters/*``, no selector) runs while two tasks write widgets and one writes
   ConfigMaps; meanwhile PROBES watch-lists (``sendInitialEvents=true``, no resourceVersion, a
   selector that matches nothing) each return kcp's current resourceVersion X in their
   ``k8s.io/initial-events-end`` bookmark. Counted: probes whose bookmark arrived while the
   other watch had not yet delivered a widget write <= X, and how long it took to arrive.
2. **The cost of reading X**, after a write to this resource and after a write to another one:
   that watch-list, a one-item LIST (what vwserver uses), a LIST whose selector matches nothing.
3. **Bookmarks on a watch's own stream.** A watch from the resourceVersion of before some
   ConfigMap writes (another resource) with ``allowWatchBookmarks`` and ``timeoutSeconds`` N:
   when its bookmarks come and with which resourceVersion, against kcp's current X read after
   the writes (with and without that consistent read); and what ``sendInitialEvents=false`` and
   ``resourceVersionMatch`` on an ordinary watch answer (vwserver/k8s/progress.py).

The facts vwserver relies on are written next to the code (vwserver/proxy/cached.py,
FRESHNESS_WAIT); this script is how they were measured (figures vary with the machine's load).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

from devenv.bootstrap import bootstrap
from devenv.kcp import KcpInstance

NOTHING = "vwserver.kcp.io/freshness-probe,!vwserver.kcp.io/freshness-probe"
WATCH_LIST = {
    "watch": "1",
    "sendInitialEvents": "true",
    "resourceVersionMatch": "NotOlderThan",
    "allowWatchBookmarks": "true",
    "labelSelector": NOTHING,
    "timeoutSeconds": "10",
}
MERGE = {"Content-Type": "application/merge-patch+json"}


def _rv(doc: dict[str, object]) -> int:
    meta = doc["metadata"]
    assert isinstance(meta, dict)
    return int(meta["resourceVersion"])


async def watch_list_rv(s: aiohttp.ClientSession, collection: str) -> int:
    async with s.get(collection, params=WATCH_LIST) as r:
        event = json.loads(await r.content.readline())
    assert event["type"] == "BOOKMARK", event
    return _rv(event["object"])


async def list_rv(s: aiohttp.ClientSession, collection: str, params: dict[str, str]) -> int:
    async with s.get(collection, params=params) as r:
        return _rv(await r.json())


async def ordering(kcp: KcpInstance, collection: str, widgets: str, cms: str, probes: int) -> None:
    seen = 0
    writes: list[int] = []
    stop = asyncio.Event()
    async with kcp.http_session(timeout=3600) as s, kcp.http_session(timeout=3600) as w:
        start = await list_rv(s, collection, {"limit": "1"})

        async def reflector() -> None:
            nonlocal seen
            params = {"watch": "1", "resourceVersion": str(start), "allowWatchBookmarks": "true"}
            async with w.get(collection, params=params) as r:
                async for line in r.content:
                    seen = max(seen, _rv(json.loads(line)["object"]))

        async def widget_writer() -> None:
            name = f"signals-{uuid.uuid4().hex[:6]}"
            body = {"apiVersion": "example.io/v1alpha1", "kind": "Widget"}
            async with s.post(widgets, json={**body, "metadata": {"name": name}}) as r:
                writes.append(_rv(await r.json()))
            size = 0
            while not stop.is_set():
                size += 1
                patch = json.dumps({"spec": {"size": size}})
                async with s.patch(f"{widgets}/{name}", data=patch, headers=MERGE) as r:
                    writes.append(_rv(await r.json()))
            async with s.delete(f"{widgets}/{name}") as r:
                await r.read()

        async def cm_writer() -> None:
            body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "s-"}}
            while not stop.is_set():
                async with s.post(cms, json=body) as r:
                    name = (await r.json())["metadata"]["name"]
                async with s.delete(f"{cms}/{name}") as r:
                    await r.read()

        watching = asyncio.create_task(reflector())
        await asyncio.sleep(0.5)
        tasks = [asyncio.create_task(f()) for f in (widget_writer, widget_writer, cm_writer)]
        overtaken: list[float] = []
        for _ in range(probes):
            x = await watch_list_rv(s, collection)
            behind = seen
            missing = [rv for rv in writes if behind < rv <= x]
            if missing:
                t = time.monotonic()
                while seen < max(missing) and time.monotonic() - t < 5:  # noqa: ASYNC110
                    await asyncio.sleep(0.0005)
                overtaken.append(time.monotonic() - t)
        stop.set()
        await asyncio.gather(*tasks)
        watching.cancel()
    lags = sorted(overtaken)
    print(
        f"ordering: {len(lags)} of {probes} probes' bookmarks arrived before the other watch "
        f"had delivered the widget writes <= X ({len(writes)} widget writes)"
    )
    if lags:
        p50, top = lags[len(lags) // 2], lags[-1]
        print(f"  those writes arrived {p50 * 1000:.1f} ms later (median), {top * 1000:.1f} max")


async def costs(kcp: KcpInstance, collection: str, widgets: str, cms: str) -> None:
    name = f"signals-{uuid.uuid4().hex[:6]}"
    widget = {"apiVersion": "example.io/v1alpha1", "kind": "Widget", "metadata": {"name": name}}
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}
    async with kcp.http_session() as s:
        for url, body in ((widgets, widget), (cms, cm)):
            async with s.post(url, json=body) as r:
                assert r.status == 201, await r.text()
        reads: dict[str, Callable[[], Awaitable[int]]] = {
            "watch-list, nothing matches": lambda: watch_list_rv(s, collection),
            "LIST limit=1": lambda: list_rv(s, collection, {"limit": "1"}),
            "LIST, nothing matches": lambda: list_rv(s, collection, {"labelSelector": NOTHING}),
        }
        writes: dict[str, Callable[[int], dict[str, object]]] = {
            f"{widgets}/{name}": lambda i: {"spec": {"size": i}},
            f"{cms}/{name}": lambda i: {"data": {"n": str(i)}},
        }
        for url, patch in writes.items():
            took: dict[str, list[float]] = {what: [] for what in reads}
            for i in range(30):
                for what, read in reads.items():
                    async with s.patch(url, data=json.dumps(patch(i)), headers=MERGE) as r:
                        written = _rv(await r.json())
                    t = time.perf_counter()
                    x = await read()
                    took[what].append(time.perf_counter() - t)
                    assert x >= written, (what, x, written)  # never older than the write
            before = "a widget write" if url.startswith(widgets) else "a configmap write"
            for what, times in took.items():
                p50 = statistics.median(times) * 1e3
                print(f"cost after {before}: {what:<28} p50 {p50:.1f} ms")
        for url in (widgets, cms):
            async with s.delete(f"{url}/{name}") as r:
                await r.read()


async def _configmap_writes(s: aiohttp.ClientSession, cms: str, count: int) -> int:
    """``count`` ConfigMaps created and updated; the last write's resourceVersion."""
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "s-"}}
    last = 0
    for n in range(count):
        async with s.post(cms, json=body) as r:
            name = (await r.json())["metadata"]["name"]
        patch = json.dumps({"data": {"n": str(n)}})
        async with s.patch(f"{cms}/{name}", data=patch, headers=MERGE) as r:
            last = _rv(await r.json())
        async with s.delete(f"{cms}/{name}") as r:
            await r.read()
    return last


async def _watch_lines(
    s: aiohttp.ClientSession, collection: str, params: dict[str, str], limit: float
) -> tuple[int, list[tuple[float, str, int]]]:
    """The watch's status and its lines as (seconds after the request, type, resourceVersion),
    until it ends (or ``limit`` seconds)."""
    t0 = time.monotonic()
    seen: list[tuple[float, str, int]] = []
    async with s.get(collection, params=params) as r:
        if r.status != 200:
            return r.status, [(time.monotonic() - t0, (await r.text())[:400], 0)]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(limit):
                async for line in r.content:
                    event = json.loads(line)
                    seen.append((time.monotonic() - t0, event["type"], _rv(event["object"])))
        seen.append((time.monotonic() - t0, "END", 0))
        return r.status, seen


async def deadline_bookmarks(kcp: KcpInstance, collection: str, cms: str, rounds: int) -> None:
    async with kcp.http_session(timeout=120) as s:
        cases: list[tuple[str, dict[str, str], bool]] = [
            (f"timeoutSeconds={n}", {"timeoutSeconds": str(n)}, True) for n in (1, 2, 3, 6)
        ]
        cases += [
            (
                "timeoutSeconds=3, no consistent read after the writes",
                {"timeoutSeconds": "3"},
                False,
            ),
            (
                "sendInitialEvents=false, timeoutSeconds=8",
                {"timeoutSeconds": "8", "sendInitialEvents": "false"},
                True,
            ),
            (
                "sendInitialEvents=false, resourceVersionMatch=NotOlderThan",
                {
                    "timeoutSeconds": "8",
                    "sendInitialEvents": "false",
                    "resourceVersionMatch": "NotOlderThan",
                },
                True,
            ),
            (
                "resourceVersionMatch=NotOlderThan (no sendInitialEvents)",
                {"timeoutSeconds": "8", "resourceVersionMatch": "NotOlderThan"},
                True,
            ),
        ]
        for what, extra, consistent_read in cases:
            for _ in range(rounds):
                start = await list_rv(s, collection, {"limit": "1"})
                written = await _configmap_writes(s, cms, 3)
                x = await list_rv(s, collection, {"limit": "1"}) if consistent_read else written
                params = {
                    "watch": "1",
                    "resourceVersion": str(start),
                    "allowWatchBookmarks": "true",
                    **extra,
                }
                status, seen = await _watch_lines(s, collection, params, 12)
                shown = ", ".join(
                    f"{kind} {rv - x:+d} at {t:.2f}s" if rv else f"{kind} at {t:.2f}s"
                    for t, kind, rv in seen
                )
                print(f"{what}: start {start - x:+d}, x={x}: {status}: {shown}")


async def main() -> None:
    probes = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    kcp = KcpInstance.from_kubeconfig(
        Path(os.environ["KCP_KUBECONFIG"]),
        workdir=Path(os.environ.get("TMPDIR", "/tmp")),
        context=os.environ.get("KCP_CONTEXT"),
    )
    world = await bootstrap(kcp)
    collection = f"{world.vw_url}/clusters/*/{world.api_path}/{world.resource}"
    home, other = world.consumers[0], world.consumers[1]
    widgets = f"{home.url}/{world.api_path}/namespaces/default/{world.resource}"
    cms = f"{other.url}/api/v1/namespaces/default/configmaps"
    if os.environ.get("FRESHNESS_ONLY") != "bookmarks":
        await ordering(kcp, collection, widgets, cms, probes)
        await costs(kcp, collection, widgets, cms)
    await deadline_bookmarks(kcp, collection, cms, rounds=3)


if __name__ == "__main__":
    asyncio.run(main())
