"""Every write verb through a cached slice against the same verb on kcp's APIExport VW directly.

One kcp of the benchmark's own (:func:`kcpbench.kcp_world`), one vwserver with the shared cache
in front of its APIExport virtual workspace (serving TLS, as kcp does), and one load process
(``write_client.py``, keep-alive connections) that takes the two targets in turn, round after
round, on the same consumer workspace and namespace with the same labels (inside the slice).
Per verb: latency p50 and p99 at concurrency 1, throughput at concurrency 16, and what each
operation cost: kcp's CPU
and kcp's own request count (from kcp's ``/metrics``), and for the slice vwserver's requests to
kcp (``vwserver_upstream_requests_total``) and its own CPU. Everything is a ratio to the direct
call in the same run except the upstream requests per operation, a count.

kcp's CPU per operation is the process's CPU time over the run (from /proc, see ``scrape.py``
for why not its ``process_cpu_seconds_total``) less what kcp spends idle over the same wall
time (its controllers; measured once before the runs): the slice's runs last longer, and would
otherwise be charged more of kcp's background work.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aiohttp
from harness import Proxy, cpu_seconds, ms, record
from kcpbench import admin_over_cached_slice, kcp_world
from results import Ratio, Results, WriteRun, over, percentile
from scrape import KcpCounters, delta, kcp_counters, read_metrics, upstream_requests
from write_client import VERBS

if TYPE_CHECKING:
    from devenv.kcp import KcpInstance

from clients import write_client

NAMESPACE = "bench-writes"
TARGETS = ("direct", "slice")
IDLE_SECONDS = 3.0
LABELS = {
    "create": "create",
    "get": "get",
    "update": "update (PUT)",
    "merge_patch": "merge patch",
    "json_patch": "JSON patch",
    "apply": "server-side apply",
    "status_patch": "status patch",
    "delete": "delete",
}
#: Issue 23's targets: (throughput as time ratio, p50 at c=1, kcp CPU, upstream requests per op).
_WRITE = ("≤ 1.25 (≥ 0.8x direct)", "≤ 1.30", "≤ 1.20", "1")
GOALS: dict[str, tuple[str, str, str, str]] = {
    "create": ("", "", "", "1"),
    "get": ("≤ 1.11 (≥ 0.9x direct)", "≤ 1.30", "", "1"),
    "update": _WRITE,
    "merge_patch": _WRITE,
    "json_patch": _WRITE,
    "apply": ("≤ 1.67 (≥ 0.6x direct)", "", "", ""),
    "status_patch": _WRITE,
    "delete": ("", "", "", "1"),
}


@dataclass
class Tally:
    """What the runs of one verb against one target at one concurrency added up to."""

    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0
    ops: int = 0
    kcp_cpu: float = 0.0  # seconds, kcp's idle rate over the wall time taken off
    kcp: list[KcpCounters] = field(default_factory=list)
    upstream: dict[str, float] = field(default_factory=dict)
    proxy_cpu: float = 0.0

    def run(self, target: str, verb: str, concurrency: int) -> WriteRun:
        ordered = sorted(s * 1000 for s in self.latencies)
        n = self.ops or 1
        return WriteRun(
            target=target,
            verb=verb,
            concurrency=concurrency,
            ops=self.ops,
            p50_ms=percentile(ordered, 50),
            p99_ms=percentile(ordered, 99),
            rps=self.ops / self.seconds if self.seconds else 0.0,
            kcp_cpu_ms=self.kcp_cpu * 1000 / n,
            kcp_requests=sum(c.total_requests for c in self.kcp) / n,
            kcp_dry_runs=sum(c.dry_runs for c in self.kcp) / n,
            upstream_requests=sum(self.upstream.values()) / n,
            upstream_methods={m: v / n for m, v in sorted(self.upstream.items())},
            proxy_cpu_ms=self.proxy_cpu * 1000 / n,
        )


@dataclass(frozen=True)
class Meter:
    """Reads kcp's and vwserver's counters around a run: the scrapes before the CPU readings
    and after them, so that no scrape's own cost falls into the measured window."""

    session: aiohttp.ClientSession
    kcp_url: str
    kcp_pid: int
    proxy: Proxy
    idle_rate: float = 0.0  # kcp CPU seconds per second, idle

    async def kcp(self) -> KcpCounters:
        return kcp_counters(await read_metrics(self.session, self.kcp_url))

    async def calibrated(self) -> Meter:
        """This meter with kcp's idle CPU rate measured (its controllers, the cache's watch)."""
        cpu0, started = cpu_seconds(self.kcp_pid), time.perf_counter()
        await asyncio.sleep(IDLE_SECONDS)
        rate = (cpu_seconds(self.kcp_pid) - cpu0) / (time.perf_counter() - started)
        return dataclasses.replace(self, idle_rate=rate)

    @contextlib.asynccontextmanager
    async def around(self, tally: Tally) -> AsyncIterator[None]:
        kcp0 = await self.kcp()
        up0 = upstream_requests(await read_metrics(self.session, self.proxy.base))
        cpu0, proxy0 = cpu_seconds(self.kcp_pid), cpu_seconds(self.proxy.pid)
        t0 = time.perf_counter()
        yield
        wall = time.perf_counter() - t0
        cpu1, proxy1 = cpu_seconds(self.kcp_pid), cpu_seconds(self.proxy.pid)
        up1 = upstream_requests(await read_metrics(self.session, self.proxy.base))
        kcp1 = await self.kcp()
        tally.kcp.append(kcp1.minus(kcp0))
        tally.kcp_cpu += max(0.0, cpu1 - cpu0 - self.idle_rate * wall)
        for method, n in delta(up1, up0).items():
            tally.upstream[method] = tally.upstream.get(method, 0.0) + n
        tally.proxy_cpu += proxy1 - proxy0


async def bench_writes(
    results: Results,
    *,
    concurrency: tuple[int, ...],
    ops: dict[int, int],
    rounds: int,
    page_size: int,
) -> None:
    low, high = min(concurrency), max(concurrency)
    async with kcp_world() as (kcp, world):
        ws = world.consumer("consumer-a")
        await kcp.kubectl("create", "namespace", NAMESPACE, server=ws.url)
        collection = f"/clusters/{ws.cluster}/{world.api_path}/namespaces/{NAMESPACE}/widgets"
        async with admin_over_cached_slice(kcp, world, page_size=page_size) as (tp, s):
            px = tp.proxy
            urls = {"direct": world.vw_url + collection, "slice": px.slice_base + collection}
            # The cache has listed and watches the resource before anything is timed.
            async with s.get(f"{px.slice_base}/clusters/*/{world.api_path}/widgets") as r:
                if r.status != 200:
                    raise RuntimeError(f"LIST through the slice: {r.status} {await r.text()}")
            async with write_client(urls, token=kcp.admin_token, ca=tp.ca_bundle) as wc:
                await wc.prepare(high)
                for verb in VERBS:  # warm-up: connections, auth caches, kcp's first writes
                    for target in TARGETS:
                        await wc.run(
                            target, verb, concurrency=high, ops=2 * high, prefix=f"{target}-warm"
                        )
                meter = await Meter(s, kcp.url, kcp_pid(kcp), px).calibrated()
                note = (
                    f"writes: kcp idle at {meter.idle_rate * 100:.1f} % of a core (taken off "
                    "each run's kcp CPU over its wall time)"
                )
                results.notes.append(note)
                print(note, flush=True)
                tallies: dict[tuple[str, str, int], Tally] = {}
                for r_ in range(rounds):
                    for verb in VERBS:
                        for c in concurrency:
                            order = TARGETS[r_ % 2 :] + TARGETS[: r_ % 2]
                            for target in order:
                                tally = tallies.setdefault((target, verb, c), Tally())
                                await wc.warm(target, concurrency=c)
                                async with meter.around(tally):
                                    lat, wall = await wc.run(
                                        target,
                                        verb,
                                        concurrency=c,
                                        ops=ops[c],
                                        prefix=f"{target}-r{r_}-c{c}",
                                    )
                                tally.latencies += lat
                                tally.seconds += wall
                                tally.ops += len(lat)
                                print(
                                    f"  round {r_ + 1}/{rounds} {verb:<12} c={c:<3} {target:<6} "
                                    f"{len(lat) / wall:8.1f} op/s",
                                    flush=True,
                                )
    runs = {key: t.run(*key) for key, t in tallies.items()}
    results.writes += runs.values()
    for verb in VERBS:
        record_verb(results, verb, runs, low=low, high=high)


def kcp_pid(kcp: KcpInstance) -> int:
    """The pid of the kcp the benchmark started (its CPU is read from /proc)."""
    pid: int | None = kcp.process.pid if kcp.process else None
    if pid is None:
        raise RuntimeError("kcp is not a process of this benchmark: its CPU cannot be read")
    return pid


def record_verb(
    results: Results,
    verb: str,
    runs: dict[tuple[str, str, int], WriteRun],
    *,
    low: int,
    high: int,
) -> None:
    name = LABELS[verb]
    goal_rps, goal_p50, goal_cpu, goal_up = GOALS[verb]
    d1, s1 = runs[("direct", verb, low)], runs[("slice", verb, low)]
    dh, sh = runs[("direct", verb, high)], runs[("slice", verb, high)]
    latencies = ((50, s1.p50_ms, d1.p50_ms, goal_p50), (99, s1.p99_ms, d1.p99_ms, ""))
    for q, via, plain, goal in latencies:
        record(
            results,
            f"writes.{verb}.c{low}.p{q}",
            Ratio(
                label=f"{name} at concurrency {low}, p{q}",
                value=over(via, plain),
                detail=f"{ms(via / 1000)} vs {ms(plain / 1000)} direct, {s1.ops:,} ops each",
                target=goal,
            ),
        )
    record(
        results,
        f"writes.{verb}.c{high}.time",
        Ratio(
            label=f"{name} at concurrency {high}, time per op",
            value=over(dh.rps, sh.rps),
            detail=f"throughput {over(sh.rps, dh.rps):.2f}x direct: "
            f"{sh.rps:,.0f} vs {dh.rps:,.0f} op/s",
            target=goal_rps,
        ),
    )
    record(
        results,
        f"writes.{verb}.kcp_cpu",
        Ratio(
            label=f"{name}, kcp CPU per op (c={high})",
            value=over(sh.kcp_cpu_ms, dh.kcp_cpu_ms),
            detail=f"{sh.kcp_cpu_ms:.2f} vs {dh.kcp_cpu_ms:.2f} ms direct; vwserver "
            f"{sh.proxy_cpu_ms:.2f} ms",
            target=goal_cpu,
        ),
    )
    record(
        results,
        f"writes.{verb}.kcp_requests",
        Ratio(
            label=f"{name}, kcp's own requests per op",
            value=over(sh.kcp_requests, dh.kcp_requests),
            detail=f"{sh.kcp_requests:.1f} vs {dh.kcp_requests:.1f} direct "
            f"(dry-runs {sh.kcp_dry_runs:.1f} vs {dh.kcp_dry_runs:.1f})",
        ),
    )
    record(
        results,
        f"writes.{verb}.upstream",
        Ratio(
            label=f"{name}, vwserver's upstream requests per op",
            value=sh.upstream_requests,
            detail=", ".join(f"{m} {v:.2f}" for m, v in sh.upstream_methods.items())
            + " (direct: 1 request)",
            unit="req/op",
            target=goal_up,
        ),
    )
