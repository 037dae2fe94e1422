"""Watch fan-out: one change delivered to N watchers of one slice from vwserver's cache.

Method. Three processes besides this one: the fake upstream, vwserver (cache on) and the
watchers (``watch_client.py``: raw sockets, uvloop, a timestamp per read and nothing else while
recording). The watcher process also holds one *direct* watch on the upstream (the slice's
labelSelector), so every event has a direct arrival taken with the same clock. This process
is the writer: it creates one object, waits long enough for every watcher to have it, then the
next, so what is measured is one change's delivery, not a saturated pipeline. Times are
CLOCK_MONOTONIC in every process:

* delivery latency = arrival - the write's start, for the direct watcher and for each watcher
  through vwserver; the ratio compares the same percentile of the two;
* added latency = arrival through vwserver - the direct arrival of the same event.

The upstream counts the watches it streams: during a run it must be exactly two, vwserver's
one shared watch and the direct watcher, whatever N is.

``workers`` (``run.py --workers 1,2``): the runs again for each vwserver worker count (ratios
keyed ``fanout.w<N>.…`` for N > 1). Each worker has its own cache, so the upstream then streams
N + 1 watches; CPU per delivery is summed over the workers, and the RSS of each is printed
(the watchers spread over the workers by the kernel). Throughput is printed as deliveries per
second over the run's span (first write to last delivery): with ``--fanout-spacing 0`` the
writes go back to back (a burst: the latencies then include the queueing) and it is what
vwserver sustains, else what the writer asked for.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from urllib.parse import urlencode

from harness import (
    SELECTOR,
    UNLIMITED_CONNECTIONS,
    WATCH_PARAMS,
    cpu_seconds,
    fake_upstream,
    record,
    rss_kib,
    session,
    vwserver,
    widget,
)
from results import FanoutRun, Ratio, Results, percentile, quantiles

from clients import WatchClient, watch_client


def spacing_for(watchers: int, base: float) -> float:
    """Seconds between two writes: long enough for the previous change to reach everyone
    (``base`` 0: none, a burst — for throughput, not latency)."""
    return base + watchers * 0.0003 if base > 0 else 0.0


async def bench_fanout(
    results: Results,
    counts: tuple[int, ...],
    *,
    events: int,
    spacing: float,
    workers: tuple[int, ...] = (1,),
) -> None:
    for n in workers:
        await _bench_fanout(results, counts, events=events, spacing=spacing, workers=n)


async def _bench_fanout(
    results: Results, counts: tuple[int, ...], *, events: int, spacing: float, workers: int
) -> None:
    async with (
        fake_upstream(100) as up,
        vwserver(up.origin, cache=True, extra_yaml=UNLIMITED_CONNECTIONS, workers=workers) as px,
        session() as s,
    ):
        groups = {
            "direct": f"{up.list_url}?{urlencode({**WATCH_PARAMS, 'labelSelector': SELECTOR})}",
            "proxied": f"{px.list_url}?{urlencode(WATCH_PARAMS)}",
        }
        for n in counts:
            async with watch_client(groups) as client:
                await client.open("direct", 1)
                await client.open("proxied", n)
                upstream_watches = await up.watches() - 1  # the direct watcher's own
                if upstream_watches > len(px.server_pids):  # one per worker that got a watch
                    raise RuntimeError(
                        f"{n} watchers through vwserver hold {upstream_watches} upstream watches"
                    )
                await client.record()
                pids = (*px.server_pids, client.pid)
                cpu = {pid: cpu_seconds(pid) for pid in pids}
                sent: dict[str, float] = {}
                for i in range(events):
                    name = f"fanout-{n}-{i}"
                    sent[name] = time.monotonic()
                    async with s.post(up.namespaced_url(), json=widget(name)) as r:
                        if r.status != 201:
                            raise RuntimeError(f"create {name}: {r.status} {await r.text()}")
                    await asyncio.sleep(spacing_for(n, spacing))
                # The last write has had its spacing: the watcher process's CPU is read before
                # the first collect, which costs it its own scan; vwserver's once everything
                # is delivered (a burst is still being delivered here).
                spent = cpu_seconds(client.pid) - cpu[client.pid]
                arrivals = await all_delivered(client, watchers=n, events=events)
                cpu = {pid: cpu_seconds(pid) - before for pid, before in cpu.items()}
                cpu[client.pid] = spent
                rss = ", ".join(f"{rss_kib(pid) / 1024:.1f}" for pid in px.server_pids)
            delivery = Delivery(watchers=n, events=events, sent=sent, arrivals=arrivals)
            add_run(
                results,
                delivery,
                upstream_watches=upstream_watches,
                server_cpu=sum(cpu[pid] for pid in px.server_pids),
                client_cpu=cpu[client.pid],
                workers=workers,
            )
            print(
                f"{'':<44} {workers} worker(s): RSS {rss} MiB; "
                f"{delivery.throughput():,.0f} deliveries/s over the run"
            )


async def all_delivered(
    client: WatchClient, *, watchers: int, events: int, within: float = 60.0
) -> dict[str, dict[str, list[float]]]:
    """The arrivals once every event has reached every watcher, or after *within* seconds
    (a missing delivery is then reported, not waited for forever)."""
    deadline = time.monotonic() + within
    while True:
        arrivals = await client.collect()
        got = {group: sum(map(len, names.values())) for group, names in arrivals.items()}
        complete = got["direct"] >= events and got["proxied"] >= watchers * events
        if complete or time.monotonic() > deadline:
            return arrivals
        await asyncio.sleep(0.5)


@dataclass(frozen=True, kw_only=True)
class Delivery:
    """What one run wrote and when its watchers received it."""

    watchers: int
    events: int
    sent: dict[str, float]  # name → when its write started
    arrivals: dict[str, dict[str, list[float]]]  # group → name → arrival times

    def throughput(self) -> float:
        """Deliveries through vwserver per second, from the first write to the last one."""
        times = [t for ts in self.arrivals["proxied"].values() for t in ts]
        if not times or not self.sent:
            return 0.0
        return len(times) / max(max(times) - min(self.sent.values()), 1e-9)

    def latencies(self) -> tuple[list[float], list[float], list[float]]:
        """Sorted ms: write → direct watcher, write → each watcher through vwserver, and the
        latter minus the direct arrival of the same event."""
        sent = self.sent
        direct = {n: times[0] for n, times in self.arrivals["direct"].items() if n in sent}
        proxied = {n: times for n, times in self.arrivals["proxied"].items() if n in sent}
        return (
            sorted((t - sent[n]) * 1000 for n, t in direct.items()),
            sorted((t - sent[n]) * 1000 for n, ts in proxied.items() for t in ts),
            sorted((t - direct[n]) * 1000 for n, ts in proxied.items() if n in direct for t in ts),
        )


def add_run(
    results: Results,
    delivery: Delivery,
    *,
    upstream_watches: int,
    server_cpu: float,
    client_cpu: float,
    workers: int = 1,
) -> None:
    """Keep and print one run's figures (CPU in seconds while the events flowed)."""
    watchers, events = delivery.watchers, delivery.events
    direct_ms, proxied_ms, added_ms = delivery.latencies()
    delivered = len(proxied_ms)
    if len(direct_ms) < events or delivered < watchers * events:
        print(
            f"fan-out {watchers}: only {len(direct_ms)}/{events} direct and "
            f"{delivered}/{watchers * events} proxied deliveries arrived"
        )
    run = FanoutRun(
        watchers=watchers,
        events=events,
        delivered=delivered,
        upstream_watches=upstream_watches,
        server_cpu_us=server_cpu * 1e6 / max(delivered, 1),
        client_cpu_us=client_cpu * 1e6 / max(delivered, 1),
        direct_ms=quantiles(direct_ms),
        proxied_ms=quantiles(proxied_ms),
        added_ms=quantiles(added_ms),
    )
    if workers == 1:  # (the plot shows one process)
        results.fanout.append(run)
    for q in (50, 99):
        via, plain = percentile(proxied_ms, q), percentile(direct_ms, q)
        record(
            results,
            f"fanout.{watchers}.p{q}" if workers == 1 else f"fanout.w{workers}.{watchers}.p{q}",
            Ratio(
                label=f"fan-out to {watchers:,} watcher{'s' if watchers > 1 else ''}, "
                f"delivery p{q}" + (f", {workers} workers" if workers > 1 else ""),
                value=via / plain,
                detail=f"{via:.1f} ms vs {plain:.1f} ms direct; "
                f"added {percentile(added_ms, q):.1f} ms",
                target="added p99 ≤ 50 ms at 1,000" if q == 99 else "",
            ),
        )
    print(
        f"{'':<44} {delivered:,}/{watchers * events:,} delivered; upstream watches held by "
        f"vwserver: {run.upstream_watches}; CPU per delivery: vwserver "
        f"{run.server_cpu_us:.0f} µs, watcher process {run.client_cpu_us:.0f} µs"
    )
