"""Per shard of a sharded kcp: vwserver's endpoint against that shard's APIExport VW directly.

The bed is the tests' sharded kcp (``devenv.shards``: cache server, root shard, second shard,
front-proxy) with the demo world placed across it (``bootstrap_placed``: a consumer on each
shard). Each consumer gets ``objects`` widgets (half ``env=prod``). Then, per shard in turn, one
vwserver process with the shared cache, serving TLS like kcp, whose slice ``prod`` serves that
shard's VW URL only — what one shard-scoped replica set serves (README, "Sharded kcp") — and,
timed in the same run against the shard's VW with the slice's labelSelector:

* LIST: the slice's whole collection (``clusters/*``), median of ``repeat`` rounds taken in
  turn; the ratio is vwserver's time over the direct time. Upstream requests per LIST are
  vwserver's ``vwserver_upstream_requests_total`` over the timed LISTs (0: every one served
  from the cache).
* WATCH fan-out: ``watchers`` watches through vwserver and as many on the shard's VW directly,
  all opened at the same resourceVersion; ``events`` widgets created one at a time (each waits
  for every watcher to have it); per event the delivery time (write start → arrival) at each
  watcher. The ratio compares the medians (and the p99s) of the two groups. Upstream watches
  are vwserver's cache collections of that shard during the run (1: one shared watch).

All watchers and the writer run in this process, so the client's own cost lands on both groups
alike. Nothing here is a test assertion; the machine is shared (the load is in the report).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp
from harness import SELECTOR, list_once, ms, record, timed_rounds
from kcpbench import SETTLE, admin_over_cached_slice, create_widgets
from results import Ratio, Results, percentile

if TYPE_CHECKING:
    from devenv.bootstrap import Bootstrap
    from devenv.shards import ShardedKcp

NAMESPACE = "bench-shards"
WATCH_TIMEOUT = 60.0


@dataclass(frozen=True, kw_only=True)
class ShardSizes:
    objects: int  # widgets per consumer (one per shard), half matching
    repeat: int  # LIST rounds
    watchers: int  # per group (through vwserver, direct)
    events: int  # changes delivered one at a time
    page_size: int  # vwserver's listPageSize


async def bench_shards(results: Results, z: ShardSizes) -> None:
    from devenv.shards import (
        DEMO_PLACEMENT,
        SHARD_NAMES,
        bootstrap_placed,
        build_sharded_kcp,
        start_sharded_kcp,
    )

    binaries = await asyncio.to_thread(build_sharded_kcp)
    started = time.perf_counter()
    async with start_sharded_kcp(binaries=binaries) as bed:
        world = await bootstrap_placed(bed)
        note = (
            f"shards: sharded kcp ready after {bed.ready_seconds:.0f} s, demo placed across "
            f"its shards after {time.perf_counter() - started:.0f} s"
        )
        print(note, flush=True)
        results.notes.append(note)
        for shard in SHARD_NAMES:
            (consumer,) = (c for c in world.consumers if DEMO_PLACEMENT.get(c.name) == shard)
            vw = next(u for u in world.vw_urls if bed.shard_of_url(u) == shard)
            await _fill(bed, world, consumer.path, z.objects)
            await asyncio.sleep(SETTLE)
            await _measure(results, bed, world, z, shard=shard, vw=vw, consumer=consumer.path)


async def _fill(bed: ShardedKcp, world: Bootstrap, workspace: str, objects: int) -> None:
    kcp = bed.front
    await kcp.kubectl("create", "namespace", NAMESPACE, server=kcp.cluster_url(workspace))
    url = f"{kcp.url}/clusters/{workspace}/{world.api_path}/namespaces/{NAMESPACE}/widgets"
    started = time.perf_counter()
    async with kcp.http_session(timeout=600) as s:
        await create_widgets(s, url, range(objects))
    print(f"shards: {objects:,} widgets in {workspace} in {time.perf_counter() - started:.0f} s")


async def _measure(
    results: Results,
    bed: ShardedKcp,
    world: Bootstrap,
    z: ShardSizes,
    *,
    shard: str,
    vw: str,
    consumer: str,
) -> None:
    kcp = bed.front
    repeat, watchers, events, page_size = z.repeat, z.watchers, z.events, z.page_size
    async with admin_over_cached_slice(kcp, world, page_size=page_size, vw_url=vw) as (tp, s):
        direct = f"{vw}/clusters/*/{world.api_path}/widgets"
        cached = f"{tp.proxy.slice_base}/clusters/*/{world.api_path}/widgets"
        selected = {"labelSelector": SELECTOR}
        await list_once(s, cached, {})  # the cache's first list, not timed
        before = await _metric(s, tp.proxy.base, "vwserver_upstream_requests_total")
        timings = await timed_rounds(
            {
                "direct": lambda: list_once(s, direct, selected),
                "cache": lambda: list_once(s, cached, {}),
            },
            repeat,
        )
        per_list = (
            await _metric(s, tp.proxy.base, "vwserver_upstream_requests_total") - before
        ) / repeat
        (d, n1), (c, n2) = timings["direct"], timings["cache"]
        if n1 != n2:
            raise RuntimeError(f"shard {shard}: LIST answers differ: direct {n1}, slice {n2}")
        record(
            results,
            f"shards.{shard}.list",
            Ratio(
                label=f"shard {shard}: LIST {n2:,} matching widgets, cache",
                value=c / d,
                detail=f"{ms(c)} vs {ms(d)} direct; {per_list:g} upstream requests/LIST",
                target="≤ 1.0",
            ),
        )
        fan = await _fanout(
            s,
            kcp_url=f"{kcp.url}/clusters/{consumer}/{world.api_path}/namespaces/{NAMESPACE}/widgets",
            direct=direct,
            cached=cached,
            watchers=watchers,
            events=events,
            shard=shard,
        )
        collections = await _metric(s, tp.proxy.base, "vwserver_cache_synced")
        d50, c50 = statistics.median(fan["direct"]), statistics.median(fan["slice"])
        d99 = percentile(sorted(fan["direct"]), 99)
        c99 = percentile(sorted(fan["slice"]), 99)
        record(
            results,
            f"shards.{shard}.fanout",
            Ratio(
                label=f"shard {shard}: WATCH fan-out to {watchers} watchers, p50",
                value=c50 / d50,
                detail=(
                    f"{ms(c50)} vs {ms(d50)} direct (p99 {ms(c99)} vs {ms(d99)}), "
                    f"{events} events; {collections:g} upstream watch(es) for {watchers}"
                ),
                target="≤ 1.5",
            ),
        )


async def _metric(s: aiohttp.ClientSession, base: str, name: str) -> float:
    """The sum of every sample of metric ``name`` on vwserver's ``/metrics``."""
    async with s.get(f"{base}/metrics") as r:
        text = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + "{", name + " "))
    )


async def _fanout(
    s: aiohttp.ClientSession,
    *,
    kcp_url: str,
    direct: str,
    cached: str,
    watchers: int,
    events: int,
    shard: str,
) -> dict[str, list[float]]:
    """Delivery seconds (write start → arrival) per watcher and event, by group."""
    async with s.get(cached, params={"limit": "1"}) as r:
        rv = (await r.json())["metadata"]["resourceVersion"]
    arrivals: dict[str, asyncio.Queue[tuple[str, float]]] = {}
    opened: list[asyncio.Event] = []
    tasks = []
    for group, url, params in (
        ("direct", direct, {"labelSelector": SELECTOR}),
        ("slice", cached, {}),
    ):
        for i in range(watchers):
            queue: asyncio.Queue[tuple[str, float]] = asyncio.Queue()
            arrivals[f"{group}-{i}"] = queue
            ready = asyncio.Event()
            opened.append(ready)
            query = {**params, "watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "false"}
            tasks.append(asyncio.create_task(_watch(s, url, query, queue, ready)))
    out: dict[str, list[float]] = {"direct": [], "slice": []}
    try:
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in opened)), WATCH_TIMEOUT)
        for n in range(events):
            name = f"fan-{shard}-{n:04d}"
            start = time.perf_counter()
            body = {
                "apiVersion": "example.io/v1alpha1",
                "kind": "Widget",
                "metadata": {"name": name, "labels": {"env": "prod", "bench": "yes"}},
                "spec": {"size": 1, "color": "red"},
            }
            async with s.post(kcp_url, json=body) as r:
                if r.status != 201:
                    raise RuntimeError(f"creating {name}: {r.status} {await r.text()}")
            for key, queue in arrivals.items():
                got, at = await asyncio.wait_for(queue.get(), WATCH_TIMEOUT)
                if got != name:
                    raise RuntimeError(f"{key}: {got} arrived, {name} expected")
                out[key.split("-", 1)[0]].append(at - start)
        return out
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _watch(
    s: aiohttp.ClientSession,
    url: str,
    query: dict[str, str],
    arrivals: asyncio.Queue[tuple[str, float]],
    ready: asyncio.Event,
) -> None:
    async with s.get(url, params=query, timeout=aiohttp.ClientTimeout(total=None)) as r:
        if r.status != 200:
            raise RuntimeError(f"WATCH {url}: {r.status} {await r.text()}")
        ready.set()
        buffer = b""
        async for chunk in r.content.iter_any():
            at = time.perf_counter()
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if b'"type":"ADDED"' in line and b'"name":"fan-' in line:
                    name = line.split(b'"name":"', 1)[1].split(b'"', 1)[0].decode()
                    arrivals.put_nowait((name, at))
