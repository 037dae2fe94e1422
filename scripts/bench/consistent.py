"""Consistent reads through a cached slice against the same reads on kcp's APIExport VW directly.

A consistent LIST (no resourceVersion) is what ``kubectl get`` sends and what must see every
write that completed before it; ``resourceVersion=0`` (what informers list with) may be served
from any state and is timed for reference. One kcp of the benchmark's own; one consumer
workspace grows to each count of *matching* objects in turn (``env=prod``, the slice's label,
with as many ``env=dev`` beside them), and at each count a vwserver with the shared cache
starts fresh (serving TLS, as kcp does). Every path is timed in turn, against the direct call
of the same shape: the consumer's whole collection (all namespaces), the direct call with the
slice's labelSelector;
``kubectl get -A`` as a process (its discovery, its pages of Tables, its printing; directly
with ``-l env=prod``), with
kubectl's default paging (``limit=500``, seen in ``kubectl -v=6``) and with each
``--chunk-size`` asked for, against the same kubectl pointed at kcp directly. What one
consistent LIST through the slice cost is counted once more after the timing: vwserver's
requests to kcp, the cache's answers (served / fallback) and kcp's CPU against the direct LIST.

``busy`` (``run.py --consistent-busy SECONDS``): while the paths are timed and counted, a
ConfigMap in the other consumer workspace is created and deleted every that many seconds —
kcp's resourceVersion then runs ahead of the cache's stream without an event on it, the case
where a consistent read can only be proven after kcp's next bookmark (see docs/cache.md) and is
otherwise answered by kcp.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import yaml
from harness import SELECTOR, Proxy, cache_reads, list_once, ms, record, timed_rounds
from kcpbench import SETTLE, admin_over_cached_slice, create_widgets, kcp_world
from results import ListPoint, Ratio, Results, over
from writes import Meter, Tally, kcp_pid

NAMESPACE = "bench-reads"
KUBECTL_TIMEOUT = 600.0


def write_kubeconfig(path: Path, *, server: str, token: str, ca: Path) -> None:
    """A kubeconfig for kubectl towards *server* as kcp's admin (private: the token)."""
    from vwserver.files import write_private

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "bench",
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
        "clusters": [
            {"name": "bench", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "bench", "user": {"token": token}}],
    }
    write_private(path, yaml.safe_dump(doc))


async def kubectl_get(*, kubeconfig: Path, cache_dir: Path, chunk: str, selector: str) -> int:
    """Run ``kubectl get widgets -A [-l selector]`` once; the rows it printed."""
    args = [f"--kubeconfig={kubeconfig}", f"--cache-dir={cache_dir}"]
    args += ["get", "widgets.example.io", "-A", "--no-headers"]
    args += [f"--selector={selector}"] if selector else []
    args += [] if chunk == "default" else [f"--chunk-size={chunk}"]
    proc = await asyncio.create_subprocess_exec(
        "kubectl", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), KUBECTL_TIMEOUT)
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl get ({kubeconfig}): {proc.returncode} {err.decode()[-500:]}")
    return out.count(b"\n")


def kubectl_path(chunk: str) -> str:
    return "kubectl get" if chunk == "default" else f"kubectl get --chunk-size={chunk}"


@contextlib.asynccontextmanager
async def other_writes(
    s: aiohttp.ClientSession, url: str, every: float
) -> AsyncIterator[list[int]]:
    """A ConfigMap created and deleted at ``url`` every ``every`` seconds (0: nothing) while the
    block runs; yields [writes made]."""
    made = [0]
    stop = asyncio.Event()

    async def write() -> None:
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "busy-"}}
        while not stop.is_set():
            async with s.post(url, json=body) as r:
                name = (await r.json())["metadata"]["name"]
            async with s.delete(f"{url}/{name}") as r:
                await r.read()
            made[0] += 2
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every)

    task = asyncio.create_task(write()) if every > 0 else None
    try:
        yield made
    finally:
        stop.set()
        if task is not None:
            await task


async def bench_consistent(
    results: Results,
    counts: tuple[int, ...],
    *,
    repeat: int,
    page_size: int,
    chunks: tuple[str, ...],
    busy: float = 0.0,
) -> None:
    async with kcp_world() as (kcp, world):
        other = world.consumer("consumer-b")
        busy_url = f"{kcp.url}/clusters/{other.path}/api/v1/namespaces/default/configmaps"
        ws = world.consumer("consumer-a")
        await kcp.kubectl("create", "namespace", NAMESPACE, server=ws.url)
        create_url = f"{kcp.url}/clusters/{ws.path}/{world.api_path}/namespaces/{NAMESPACE}/widgets"
        made = 0
        for matching in sorted(counts):
            started = time.perf_counter()
            async with kcp.http_session(timeout=600) as s:
                await create_widgets(s, create_url, range(made, 2 * matching))
            note = (
                f"consistent: created {2 * matching - made:,} widgets in "
                f"{time.perf_counter() - started:.0f} s, {2 * matching:,} in all, half matching"
            )
            print(note, flush=True)
            results.notes.append(note)
            made = 2 * matching
            await asyncio.sleep(SETTLE)
            async with admin_over_cached_slice(kcp, world, page_size=page_size) as (tp, s):
                cx = tp.proxy
                direct = f"{world.vw_url}/clusters/{ws.cluster}/{world.api_path}/widgets"
                cached = f"{cx.slice_base}/clusters/{ws.cluster}/{world.api_path}/widgets"
                selected = {"labelSelector": SELECTOR}

                def kubectl(
                    server: str, chunk: str, name: str, *, selector: str = ""
                ) -> Callable[[], Awaitable[int]]:
                    config = kcp.workdir / f"bench-{name}.kubeconfig"
                    write_kubeconfig(config, server=server, token=kcp.admin_token, ca=tp.ca_bundle)
                    return lambda: kubectl_get(
                        kubeconfig=config,
                        cache_dir=kcp.workdir / f"kubectl-cache-{name}",
                        chunk=chunk,
                        selector=selector,
                    )

                def listing(url: str, params: dict[str, str]) -> Callable[[], Awaitable[int]]:
                    return lambda: list_once(s, url, params)

                calls = {
                    "direct": listing(direct, selected),
                    "cache": listing(cached, {}),
                    "direct rv=0": listing(direct, {**selected, "resourceVersion": "0"}),
                    "cache rv=0": listing(cached, {"resourceVersion": "0"}),
                }
                for chunk in chunks:
                    path = kubectl_path(chunk)
                    vw_server = f"{world.vw_url}/clusters/{ws.cluster}"
                    slice_server = f"{cx.slice_base}/clusters/{ws.cluster}"
                    calls[f"{path}, direct"] = kubectl(
                        vw_server, chunk, "direct", selector=SELECTOR
                    )
                    calls[f"{path}, slice"] = kubectl(slice_server, chunk, "slice")
                async with kcp.http_session() as b, other_writes(b, busy_url, busy) as churn:
                    await timed_rounds(calls, 1)  # warm up: the cache's first LIST, kubectl's
                    reads_before = await cache_reads(cx, ssl_context=tp.ssl_context())
                    timings = await timed_rounds(calls, repeat)
                    reads = await cache_reads(cx, ssl_context=tp.ssl_context())
                    costs = await one_list_costs(
                        s, kcp.url, kcp_pid(kcp), cx, direct=direct, cached=cached
                    )
                if busy:
                    note = (
                        f"consistent at {matching:,}: kcp busy, {churn[0]} ConfigMap writes in "
                        f"another workspace (one every {busy:g} s) while timed"
                    )
                    print(note, flush=True)
                    results.notes.append(note)
            record_consistent(results, matching, timings, chunks)
            record_costs(results, matching, costs, reads_before=reads_before, reads=reads)


async def one_list_costs(
    s: aiohttp.ClientSession,
    kcp_url: str,
    pid: int,
    proxy: Proxy,
    *,
    direct: str,
    cached: str,
) -> dict[str, Tally]:
    """What one consistent LIST costs, direct and through the slice, counted (not timed)."""
    meter = await Meter(s, kcp_url, pid, proxy).calibrated()
    tallies = {"direct": Tally(), "cache": Tally()}
    for path, url, params in (
        ("direct", direct, {"labelSelector": SELECTOR}),
        ("cache", cached, {}),
    ):
        async with meter.around(tallies[path]):
            await list_once(s, url, params)
        tallies[path].ops = 1
    return tallies


def record_consistent(
    results: Results,
    matching: int,
    timings: dict[str, tuple[float, int]],
    chunks: tuple[str, ...],
) -> None:
    counts = {count for _, count in timings.values()}
    if len(counts) != 1:
        raise RuntimeError(f"consistent reads of {matching:,} answered differently: {timings}")
    for path, (seconds, count) in timings.items():
        results.consistent.append(
            ListPoint(upstream="kcp", path=path, objects=matching, items=count, seconds=seconds)
        )
    items = counts.pop()
    compared = [
        ("cache", "direct", "list", "consistent LIST", "≤ 1.10 (≤ 0.25 when proven fresh)"),
        ("cache rv=0", "direct rv=0", "list_rv0", "LIST rv=0", ""),
    ]
    for chunk in chunks:
        path = kubectl_path(chunk)
        key = "kubectl" if chunk == "default" else f"kubectl_chunk{chunk}"
        compared.append((f"{path}, slice", f"{path}, direct", key, path, "≤ 1.10"))
    for path, against, key, what, target in compared:
        seconds, base = timings[path][0], timings[against][0]
        extra = ""
        if path == "cache rv=0":
            extra = f"; direct consistent {ms(timings['direct'][0])}"
        record(
            results,
            f"consistent.{key}.{matching}",
            Ratio(
                label=f"{what}, {matching:,} matching, slice",
                value=over(seconds, base),
                detail=f"{ms(seconds)} vs {ms(base)} direct, {items:,} items{extra}",
                target=target,
            ),
        )


def record_costs(
    results: Results,
    matching: int,
    costs: dict[str, Tally],
    *,
    reads_before: dict[str, int],
    reads: dict[str, int],
) -> None:
    direct, cache = costs["direct"].run("direct", "list", 1), costs["cache"].run("slice", "list", 1)
    answered = {k: reads[k] - reads_before.get(k, 0) for k in reads}
    record(
        results,
        f"consistent.list_upstream.{matching}",
        Ratio(
            label=f"consistent LIST, {matching:,} matching, vwserver's upstream requests",
            value=cache.upstream_requests,
            detail=", ".join(f"{m} {v:.0f}" for m, v in cache.upstream_methods.items())
            + f"; timed reads: {answered.get('served', 0)} served by the cache, "
            f"{answered.get('fallback', 0)} by kcp",
            unit="req/LIST",
        ),
    )
    record(
        results,
        f"consistent.list_kcp_cpu.{matching}",
        Ratio(
            label=f"consistent LIST, {matching:,} matching, kcp CPU",
            value=over(cache.kcp_cpu_ms, direct.kcp_cpu_ms),
            detail=f"{cache.kcp_cpu_ms:.0f} vs {direct.kcp_cpu_ms:.0f} ms direct; kcp requests "
            f"{cache.kcp_requests:.0f} vs {direct.kcp_requests:.0f}",
        ),
    )
