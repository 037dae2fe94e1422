"""Benchmarks: vwserver against a direct call to the same upstream, in the same run.

Timed numbers on a shared 2-core machine move around, so every result is a *ratio* against the
direct call made in the same run, from the median of several repetitions, and nothing here is a
test assertion. Upstream, proxy and client are separate processes (as in production), so each has
its own core time and the proxy's peak RSS can be read from /proc.

    python scripts/bench/run.py                 # all: LIST 10k, watch 20k events, RSS 10k vs 100k
    python scripts/bench/run.py --only list --objects 10000 --repeat 7

Targets: filtered LIST at most 1.1 times direct; filtered watch throughput at least
50 % of direct; proxy peak RSS for a 100k-object LIST at most 1.3 times that for 10k.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[2]
# The fake upstream (fakekcp) and the dev environment (devenv) live beside the package in the
# repository, not in it: this script and the processes it starts import them from there.
sys.path.insert(0, str(REPO))
SLICE_CLUSTER = "benchslice"
EXPORT_CLUSTER = "exportid"
EXPORT_NAME = "widgets.example.io"
API = "/apis/example.io/v1alpha1/widgets"
SELECTOR = "env=prod"  # half of the fake's objects
TOKEN = "bench-token"  # the proxy authenticates and authorizes the caller (caches warm)
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
WATCH_PARAMS = {
    "watch": "1",
    "sendInitialEvents": "true",
    "resourceVersionMatch": "NotOlderThan",
    "allowWatchBookmarks": "true",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def wait_http(url: str, *, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    async with aiohttp.ClientSession() as session:
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(url) as r:
                    if r.status < 500:
                        return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not come up in {within}s")
            await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def process(args: list[str], *, ready_url: str) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(*args, stdout=subprocess.DEVNULL, cwd=REPO)
    try:
        await wait_http(ready_url)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


@contextlib.asynccontextmanager
async def fake_upstream(objects: int) -> AsyncIterator[str]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args = [sys.executable, "-m", "fakekcp.upstream"]
    args += ["--port", str(port), "--objects", str(objects)]
    args += ["--user", f"{TOKEN}@{SLICE_CLUSTER}/prod"]
    vw = f"{base}/services/apiexport/{EXPORT_CLUSTER}/{EXPORT_NAME}"
    async with process(args, ready_url=vw + "/clusters/*/api"):
        yield base


@contextlib.asynccontextmanager
async def proxy(
    upstream: str,
    *,
    page_size: int,
    upstream_yaml: str | None = None,
    slice_yaml: str | None = None,
    slice_cluster: str = SLICE_CLUSTER,
    cache: bool = False,
    extra_yaml: str = "",
) -> AsyncIterator[tuple[str, int]]:
    port = free_port()
    upstream_yaml = upstream_yaml or f'{{server: "{upstream}", token: bench}}'
    slice_yaml = slice_yaml or f"export: {{cluster: {EXPORT_CLUSTER}, name: {EXPORT_NAME}}}"
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(
            f"""
listen: {{host: 127.0.0.1, port: {port}}}
insecureServing: true
upstream: {upstream_yaml}
listPageSize: {page_size}
cache: {{enabled: {str(cache).lower()}}}
{extra_yaml}
logLevel: warning
slices:
  - cluster: {slice_cluster}
    name: prod
    {slice_yaml}
    selector: {{matchLabels: {{env: prod}}}}
"""
        )
        base = f"http://127.0.0.1:{port}"
        args = [sys.executable, "-m", "vwserver.cli", "serve", "--config", str(config)]
        async with process(args, ready_url=base + "/readyz") as proc:
            yield base, proc.pid


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def timed(fn: Callable[[], Awaitable[int]], repeat: int) -> tuple[float, int]:
    times, count = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        count = await fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), count


async def list_once(session: aiohttp.ClientSession, url: str, params: dict[str, str]) -> int:
    async with session.get(url, params=params) as r:
        assert r.status == 200, r.status
        body = await r.read()
    return body.count(b'"kind":"Widget"')


async def watch_once(session: aiohttp.ClientSession, url: str, params: dict[str, str]) -> int:
    events = 0
    async with session.get(url, params=params) as r:
        assert r.status == 200, r.status
        buffer = b""
        async for chunk in r.content.iter_any():
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.startswith(b'{"type":"BOOKMARK"') and b"initial-events-end" in line:
                    return events
                events += 1
    return events


def report(name: str, direct: float, proxied: float, count: int, target: str) -> None:
    print(
        f"{name:<34} direct {direct * 1000:8.1f} ms   proxy {proxied * 1000:8.1f} ms   "
        f"ratio {proxied / direct:5.2f}   ({count} objects; target {target})"
    )


async def bench_list(objects: int, repeat: int, page_size: int) -> None:
    async with (
        fake_upstream(objects) as up,
        proxy(up, page_size=page_size) as (px, pid),
        proxy(up, page_size=page_size, cache=True) as (cx, cache_pid),
    ):
        direct_url = f"{up}/services/apiexport/{EXPORT_CLUSTER}/{EXPORT_NAME}/clusters/*{API}"
        proxy_url = f"{px}/services/filtered-apiexport/{SLICE_CLUSTER}/prod/clusters/*{API}"
        cache_url = f"{cx}/services/filtered-apiexport/{SLICE_CLUSTER}/prod/clusters/*{API}"
        async with aiohttp.ClientSession(
            skip_auto_headers=("Accept-Encoding",), headers=HEADERS
        ) as s:
            await list_once(s, direct_url, {"labelSelector": SELECTOR})  # warm up all three
            await list_once(s, proxy_url, {})
            await list_once(s, cache_url, {})  # the cache's first list and sync
            direct, n1 = await timed(
                lambda: list_once(s, direct_url, {"labelSelector": SELECTOR}), repeat
            )
            proxied, n2 = await timed(lambda: list_once(s, proxy_url, {}), repeat)
            cached, n3 = await timed(lambda: list_once(s, cache_url, {}), repeat)
            cached_any, n4 = await timed(
                lambda: list_once(s, cache_url, {"resourceVersion": "0"}), repeat
            )
        assert n1 == n2 == n3 == n4, (n1, n2, n3, n4)
        report(f"LIST {objects} objects (½ match)", direct, proxied, n2, "≤ 1.10")
        report("  from the cache (consistent read)", direct, cached, n3, "≤ 1.50 vs fake")
        report("  from the cache (resourceVersion=0)", direct, cached_any, n4, "≤ 1.50 vs fake")
        print(f"{'':<34} proxy peak RSS {peak_rss_mib(pid):.1f} MiB")
        print(f"{'':<34} cache peak RSS {peak_rss_mib(cache_pid):.1f} MiB")


async def bench_watch(events: int, repeat: int) -> None:
    async with fake_upstream(events * 2) as up, proxy(up, page_size=500) as (px, _):
        direct_url = f"{up}/services/apiexport/{EXPORT_CLUSTER}/{EXPORT_NAME}/clusters/*{API}"
        proxy_url = f"{px}/services/filtered-apiexport/{SLICE_CLUSTER}/prod/clusters/*{API}"
        async with aiohttp.ClientSession(headers=HEADERS) as s:
            direct_params = {**WATCH_PARAMS, "labelSelector": SELECTOR}
            direct, n1 = await timed(lambda: watch_once(s, direct_url, direct_params), repeat)
            proxied, n2 = await timed(lambda: watch_once(s, proxy_url, WATCH_PARAMS), repeat)
        assert n1 == n2, (n1, n2)
        print(
            f"{f'WATCH {n2} events':<34} direct {n1 / direct:8.0f} ev/s proxy {n2 / proxied:8.0f} "
            f"ev/s  throughput {direct / proxied:5.0%} of direct (target ≥ 50 %)"
        )


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _watch_until_initial_end(
    session: aiohttp.ClientSession,
    url: str,
    params: dict[str, str],
    ready: asyncio.Event,
    arrivals: dict[str, list[float]],
    opened: list[int],
    total: int,
) -> None:
    """One watcher: through its initial events, then the arrival time of every object named
    ``fanout-*`` (until cancelled)."""
    async with session.get(url, params=params) as r:
        assert r.status == 200, r.status
        initial = True
        async for line in r.content:
            if initial:
                if b"initial-events-end" in line:
                    initial = False
                    opened.append(1)
                    if len(opened) == total:
                        ready.set()
                continue
            now = time.perf_counter()
            start = line.find(b'"name":"fanout-')
            if start >= 0:
                name = line[start + 8 : line.index(b'"', start + 8)].decode()
                arrivals.setdefault(name, []).append(now)


async def bench_fanout(counts: tuple[int, ...], events: int) -> None:
    """Delivery latency of one change to N watchers of one slice from the cache, as added
    over a direct watch on the upstream; the proxy's RSS per open watch; upstream watches."""
    params = {
        "watch": "1",
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "allowWatchBookmarks": "true",
    }
    extra = "connections: {maxConnectionsPerClient: 0}"
    async with (
        fake_upstream(100) as up,
        proxy(up, page_size=500, cache=True, extra_yaml=extra) as (px, pid),
    ):
        vw = f"{up}/services/apiexport/{EXPORT_CLUSTER}/{EXPORT_NAME}"
        direct_url = f"{vw}/clusters/*{API}"
        proxy_url = f"{px}/services/filtered-apiexport/{SLICE_CLUSTER}/prod/clusters/*{API}"
        create_url = f"{vw}/clusters/cluster-0/apis/example.io/v1alpha1/namespaces/ns-0/widgets"
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, headers=HEADERS) as s:
            for n in counts:
                arrivals: dict[str, list[float]] = {}
                direct: dict[str, list[float]] = {}
                ready, opened = asyncio.Event(), []
                before = rss_mib(pid)
                tasks = [
                    asyncio.create_task(
                        _watch_until_initial_end(s, proxy_url, params, ready, arrivals, opened, n)
                    )
                    for _ in range(n)
                ]
                d_ready, d_opened = asyncio.Event(), []
                tasks.append(
                    asyncio.create_task(
                        _watch_until_initial_end(
                            s,
                            direct_url,
                            {**params, "labelSelector": SELECTOR},
                            d_ready,
                            direct,
                            d_opened,
                            1,
                        )
                    )
                )
                await asyncio.wait_for(asyncio.gather(ready.wait(), d_ready.wait()), 120)
                await asyncio.sleep(1)
                per_watch_kib = (rss_mib(pid) - before) * 1024 / n
                sent: dict[str, float] = {}
                for i in range(events):
                    name = f"fanout-{n}-{i}"
                    body = {
                        "apiVersion": "example.io/v1alpha1", "kind": "Widget",
                        "metadata": {"name": name, "namespace": "ns-0", "labels": {"env": "prod"}},
                        "spec": {"size": 1},
                    }  # fmt: skip
                    sent[name] = time.perf_counter()
                    async with s.post(create_url, json=body) as r:
                        assert r.status == 201, r.status
                    # One change at a time: its delivery latency, not a saturated pipeline's.
                    await asyncio.sleep(0.3)
                deadline = time.perf_counter() + 60
                while time.perf_counter() < deadline and (  # noqa: ASYNC110 - counters to poll
                    sum(len(v) for v in arrivals.values()) < n * events
                    or sum(len(v) for v in direct.values()) < events
                ):
                    await asyncio.sleep(0.05)
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                added = sorted(
                    t - min(direct.get(name, [t]))
                    for name, times in arrivals.items()
                    for t in times
                )
                got = len(added)
                p50 = added[len(added) // 2] * 1000 if added else float("nan")
                p99 = added[int(len(added) * 0.99) - 1] * 1000 if added else float("nan")
                print(
                    f"{f'fan-out {n} watchers':<34} added latency p50 {p50:6.1f} ms  "
                    f"p99 {p99:6.1f} ms (target p99 ≤ 50 ms at 1000)  "
                    f"{got}/{n * events} delivered; RSS {per_watch_kib:6.1f} KiB/watch "
                    "(target ≤ 64)"
                )
        async with aiohttp.ClientSession(headers=HEADERS) as s, s.get(f"{px}/debug/cache") as r:
            resources = (await r.json())["resources"]
        print(f"{'':<34} upstream resources cached: {len(resources)} (one watch each)")


async def bench_rss(small: int, large: int, page_size: int) -> None:
    peaks = {}
    for n in (small, large):
        async with fake_upstream(n) as up, proxy(up, page_size=page_size) as (px, pid):
            url = f"{px}/services/filtered-apiexport/{SLICE_CLUSTER}/prod/clusters/*{API}"
            async with aiohttp.ClientSession(headers=HEADERS) as s:
                count = await list_once(s, url, {})
            peaks[n] = peak_rss_mib(pid)
            print(f"{f'LIST {n} objects':<34} proxy peak RSS {peaks[n]:7.1f} MiB ({count} items)")
    print(f"{'RSS ratio':<34} {peaks[large] / peaks[small]:.2f} (target ≤ 1.30)")


async def bench_kcp(objects: int, repeat: int, page_size: int) -> None:
    """The same LIST and watch comparisons with real kcp as the upstream (its APIExport VW)."""
    from devenv.bootstrap import DEMO_USERS_FILE, bootstrap
    from devenv.kcp import build_kcp, start_kcp

    binary = await asyncio.to_thread(build_kcp)
    async with start_kcp(binary=binary, token_auth_file=DEMO_USERS_FILE) as kcp:
        world = await bootstrap(kcp)
        ws = world.consumer("consumer-a")
        started = time.perf_counter()
        async with kcp.http_session(timeout=120) as s:
            url = f"{kcp.url}/clusters/{ws.path}/{world.api_path}/namespaces/team-red/widgets"
            gate = asyncio.Semaphore(32)

            async def create(i: int) -> None:
                body = {
                    "apiVersion": "example.io/v1alpha1",
                    "kind": "Widget",
                    "metadata": {
                        "name": f"bench-{i:06d}",
                        "labels": {"env": ("prod", "dev")[i % 2], "bench": "yes"},
                    },
                    "spec": {"size": i % 100, "color": "red"},
                }
                async with gate, s.post(url, json=body) as r:
                    assert r.status in (201, 409), (r.status, await r.text())

            await asyncio.gather(*(create(i) for i in range(objects)))
        print(f"kcp: created {objects} widgets in {time.perf_counter() - started:.0f}s")
        upstream_yaml = f"{{kubeconfig: {kcp.kubeconfig}, context: {kcp.admin_context}}}"
        headers = {"Authorization": f"Bearer {kcp.admin_token}"}
        async with proxy(
            "",
            page_size=page_size,
            upstream_yaml=upstream_yaml,
            slice_yaml=f"upstreamURL: {world.vw_url}",
            slice_cluster=world.provider.cluster,
        ) as (px, pid):
            direct_url = f"{world.vw_url}/clusters/*{API}"
            proxy_url = (
                f"{px}/services/filtered-apiexport/{world.provider.cluster}/prod/clusters/*{API}"
            )
            connector = aiohttp.TCPConnector(ssl=kcp.ssl_context())
            async with aiohttp.ClientSession(
                connector=connector, headers=headers, skip_auto_headers=("Accept-Encoding",)
            ) as s:
                await list_once(s, direct_url, {"labelSelector": SELECTOR})
                await list_once(s, proxy_url, {})
                direct, n1 = await timed(
                    lambda: list_once(s, direct_url, {"labelSelector": SELECTOR}), repeat
                )
                proxied, n2 = await timed(lambda: list_once(s, proxy_url, {}), repeat)
                report("kcp LIST (proxy pages)", direct, proxied, n2, "≤ 1.10")
                direct_p, _ = await timed(
                    lambda: paged(s, direct_url, {"labelSelector": SELECTOR}), repeat
                )
                proxied_p, n3 = await timed(lambda: paged(s, proxy_url, {}), repeat)
                report("kcp LIST (client pages of 500)", direct_p, proxied_p, n3, "≤ 1.10")
                direct_params = {**WATCH_PARAMS, "labelSelector": SELECTOR}
                direct_w, e1 = await timed(lambda: watch_once(s, direct_url, direct_params), repeat)
                proxied_w, e2 = await timed(lambda: watch_once(s, proxy_url, WATCH_PARAMS), repeat)
            assert n1 == n2 == n3, (n1, n2, n3)
            assert e1 == e2, (e1, e2)
            print(
                f"{f'kcp WATCH {e2} initial events':<34} direct {e1 / direct_w:8.0f} ev/s "
                f"proxy {e2 / proxied_w:8.0f} ev/s  throughput {direct_w / proxied_w:5.0%} of "
                "direct (target ≥ 50 %)"
            )
            print(f"{'':<34} proxy peak RSS {peak_rss_mib(pid):.1f} MiB")
        async with proxy(
            "",
            page_size=page_size,
            upstream_yaml=upstream_yaml,
            slice_yaml=f"upstreamURL: {world.vw_url}",
            slice_cluster=world.provider.cluster,
            cache=True,
        ) as (cx, cache_pid):
            cache_url = (
                f"{cx}/services/filtered-apiexport/{world.provider.cluster}/prod/clusters/*{API}"
            )
            connector = aiohttp.TCPConnector(ssl=kcp.ssl_context())
            async with aiohttp.ClientSession(
                connector=connector, headers=headers, skip_auto_headers=("Accept-Encoding",)
            ) as s:
                await list_once(s, cache_url, {})  # the cache's first list
                direct, n1 = await timed(
                    lambda: list_once(s, direct_url, {"labelSelector": SELECTOR}), repeat
                )
                cached, n2 = await timed(lambda: list_once(s, cache_url, {}), repeat)
                cached0, n3 = await timed(
                    lambda: list_once(s, cache_url, {"resourceVersion": "0"}), repeat
                )
                direct_p, _ = await timed(
                    lambda: paged(s, direct_url, {"labelSelector": SELECTOR}), repeat
                )
                cached_p, n4 = await timed(lambda: paged(s, cache_url, {}), repeat)
            assert n1 == n2 == n3 == n4, (n1, n2, n3, n4)
            report("kcp LIST from the cache", direct, cached, n2, "≤ 0.25")
            report("kcp LIST from the cache, rv=0", direct, cached0, n3, "≤ 0.25")
            report("kcp LIST from the cache, pages", direct_p, cached_p, n4, "≤ 0.25")
            print(f"{'':<34} cache peak RSS {peak_rss_mib(cache_pid):.1f} MiB")


async def paged(session: aiohttp.ClientSession, url: str, params: dict[str, str]) -> int:
    """A LIST paged by the client, like kubectl and client-go's pager (limit=500)."""
    count, token = 0, ""
    while True:
        query = {**params, "limit": "500", **({"continue": token} if token else {})}
        async with session.get(url, params=query) as r:
            assert r.status == 200, r.status
            doc = await r.json()
        count += len(doc["items"])
        token = doc["metadata"].get("continue", "")
        if not token:
            return count


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["list", "watch", "fanout", "rss", "kcp"])
    parser.add_argument(
        "--watchers", default="1,100,1000", help="fan-out: comma-separated watcher counts"
    )
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--page-size", type=int, default=500)
    args = parser.parse_args()
    os.environ.setdefault("PYTHONPATH", str(REPO))
    print(f"vwserver benchmarks — {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    if args.only in (None, "list"):
        await bench_list(args.objects, args.repeat, args.page_size)
    if args.only in (None, "watch"):
        await bench_watch(args.events, args.repeat)
    if args.only in (None, "fanout"):
        counts = tuple(int(n) for n in args.watchers.split(","))
        await bench_fanout(counts, events=20)
    if args.only in (None, "rss"):
        await bench_rss(args.objects, args.objects * 10, args.page_size)
    if args.only in (None, "kcp"):
        await bench_kcp(args.objects, args.repeat, args.page_size)


if __name__ == "__main__":
    asyncio.run(main())
