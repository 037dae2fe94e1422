"""Soak: a thousand TLS watches on one slice for minutes, while kcp changes at a steady rate.

``vwserver serve`` runs as a process of its own, over TLS (a trustme certificate), in front of
the session's kcp (the demo world: a provider exporting Widgets, two consumer workspaces). One
static slice selects this run's label ``soak=<run>``; LIST and WATCH come from the shared watch
cache. The thousand clients are another process (:mod:`tests.soak.watchers`), each watch on its
own TLS connection. The writer (:mod:`tests.soak.plan`) creates, changes, relabels and deletes
objects in the consumer workspaces *directly in kcp*, ``RATE`` writes a second, every other one
outside the slice. kcp's own virtual workspace, watched directly with the slice's selector, is
the reference for what the slice must show.

After a warm-up (the watches open, the cache's window of recent changes full, the fan-out's
buffers grown), vwserver's RSS and open descriptors are read from ``/proc``; again when the
writes stop. Then:

* RSS at the end ≤ 1.10 times the RSS after the warm-up; open descriptors within ``FD_SLACK`` of it;
* every client received every change kcp's own watch delivered — same type, uid and
  resourceVersion, in order per object — and nothing else: no object outside the slice, ever;
* no watch starved: every change reached its *last* client within ``STARVATION_BOUND`` seconds
  of kcp's own watch delivering it (a bound on being left behind, not a latency target);
* no watch ended, and vwserver followed the resource with one upstream watch all along (one
  shared resource in ``/debug/cache`` serving every watch, no reflector restart in
  ``/metrics``).

The cache's window (``cache.window``) is set to 64 changes so that it is full after the
warm-up: with the default 4096 it would still be filling at the end (it keeps ~2.5 KB per change
of these objects), which is growth by design, not a leak.

Length: ``VWSERVER_SOAK_SECONDS`` seconds of writes (default 75, what CI runs; the full soak is
600: ``make soak``); ``VWSERVER_SOAK_WATCHES`` watches (default 1000). The figures (RSS after
warm-up and at the end, growth, cost per watch, the RSS/fd curve, how far the last client was
behind kcp) are printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from devenv.bootstrap import Bootstrap
from devenv.kcp import KcpInstance
from tests.soak.harness import (
    ReferenceWatch,
    Writer,
    https_session,
    kcp_open_watches,
    metric_samples,
    watchers_process,
)
from tests.soak.plan import LABEL, slice_event
from tests.soak.verdict import judge
from tests.support.procfs import Usage, usage
from tests.support.vwserver_process import Reaper, vwserver_process

SECONDS = float(os.environ.get("VWSERVER_SOAK_SECONDS", "75"))
WATCHES = int(os.environ.get("VWSERVER_SOAK_WATCHES", "1000"))
RATE = 4.0
"""Writes per second, every other one inside the slice."""
WARMUP = min(60.0, max(20.0, SECONDS / 5))
"""Seconds of writes before the baseline is read."""
STARVATION_BOUND = 30.0
RSS_GROWTH = 1.10
FD_SLACK = 8
WINDOW = 64
SAMPLE_EVERY = 5.0
OPEN_WITHIN = 180.0
"""Seconds for every watch to open (TLS handshakes, one review per token)."""

pytestmark = pytest.mark.timeout(SECONDS + OPEN_WITHIN + 240)


def slice_config(kcp: KcpInstance, world: Bootstrap, *, name: str, run: str) -> dict[str, Any]:
    return {
        "upstream": {"kubeconfig": str(kcp.kubeconfig), "context": kcp.admin_context},
        # Every watch holds a connection, and all come from one address.
        "connections": {"maxConnectionsPerClient": WATCHES + 64},
        "cache": {"window": WINDOW},
        "slices": [
            {
                "cluster": world.provider.cluster,
                "name": name,
                "upstreamURL": world.vw_url,
                "selector": {"matchLabels": {LABEL: run}},
            }
        ],
    }


async def cache_stats(session: aiohttp.ClientSession, base: str) -> list[dict[str, Any]]:
    """``/debug/cache`` of the health listener at ``base``."""
    async with session.get(f"{base}/debug/cache") as r:
        assert r.status == 200
        resources: list[dict[str, Any]] = (await r.json())["resources"]
        return resources


async def wait_synced(session: aiohttp.ClientSession, base: str, url: str) -> None:
    """Until the shared cache has synced (a first LIST starts it)."""
    async with asyncio.timeout(60):
        while True:
            async with session.get(url, params={"resourceVersion": "0", "limit": "1"}) as r:
                assert r.status == 200, await r.text()
            if any(s["synced"] for s in await cache_stats(session, base)):
                return
            await asyncio.sleep(0.5)


async def stopped(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it is done (whatever it raised)."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def figures(samples: list[tuple[float, Usage]], *, lines: int = 25) -> str:
    """The usage curve, thinned to about ``lines`` lines (the last sample always shown)."""
    stride = max(1, -(-len(samples) // lines))
    shown = samples[::stride] + ([samples[-1]] if (len(samples) - 1) % stride else [])
    return "\n".join(
        f"  t={t:6.1f} s  RSS {u.rss_mib:7.1f} MiB  fds {u.fds:5d}  cpu {u.cpu_seconds:7.1f} s"
        for t, u in shown
    )


async def test_a_thousand_tls_watches_soak(
    kcp: KcpInstance,
    world: Bootstrap,
    tmp_path: Path,
    reaper: Reaper,
    observe: Callable[[str], None],
) -> None:
    run = uuid.uuid4().hex[:8]
    name = f"soak-{run}"
    vw_collection = f"{world.vw_url}/clusters/*/{world.api_path}/{world.resource}"
    collection_path = urlsplit(vw_collection).path  # how /debug/cache names it (no kcp host)
    kcp_watches = {"idle": await kcp_open_watches(kcp, resource=world.resource)}
    async with contextlib.AsyncExitStack() as stack:
        served = await stack.enter_async_context(
            vwserver_process(
                slice_config(kcp, world, name=name, run=run),
                workdir=tmp_path / "vwserver",
                reaper=reaper,
                ready_within=120,
            )
        )
        base = served.base
        slice_url = (
            f"{base}/services/filtered-apiexport/{world.provider.cluster}/{name}"
            f"/clusters/*/{world.api_path}/{world.resource}"
        )
        vw = await stack.enter_async_context(
            https_session(ssl_context=served.ssl_context(), token=kcp.admin_token)
        )
        to_kcp = await stack.enter_async_context(
            https_session(ssl_context=kcp.ssl_context(), token=kcp.admin_token)
        )
        writer = Writer(to_kcp, world, run=run)
        stack.push_async_callback(writer.remove_all)

        await wait_synced(vw, served.health_base, slice_url)
        kcp_watches["vwserver synced"] = await kcp_open_watches(kcp, resource=world.resource)
        before_watches = usage(served.pid)

        reference = ReferenceWatch(to_kcp, vw_collection, selector=f"{LABEL}={run}")
        reference_task = asyncio.create_task(reference.run())
        stack.push_async_callback(stopped, reference_task)
        await reference.wait_open(within=30)
        kcp_watches["+ kcp's own reference watch"] = await kcp_open_watches(
            kcp, resource=world.resource
        )

        workdir = tmp_path / "watchers"
        workdir.mkdir()
        watchers = await stack.enter_async_context(
            watchers_process(
                url=slice_url,
                ca_file=served.ca_file,
                token=kcp.admin_token,
                clients=WATCHES,
                label=f"{LABEL}={run}",
                timeout_seconds=int(SECONDS + 3600),
                workdir=workdir,
                reaper=reaper,
            )
        )
        ready = await watchers.wait_ready(within=OPEN_WITHIN)
        opened = usage(served.pid)
        kcp_watches[f"+ {WATCHES} watches through vwserver"] = await kcp_open_watches(
            kcp, resource=world.resource
        )
        (shared,) = [
            s for s in await cache_stats(vw, served.health_base) if s["path"] == collection_path
        ]
        assert shared["subscribers"] == WATCHES, (shared, watchers.lines[-5:])

        # The soak: steady writes; usage sampled all along, the baseline after the warm-up.
        loop = asyncio.get_running_loop()
        start = loop.time()
        samples: list[tuple[float, Usage]] = []

        async def sample() -> None:
            while True:
                samples.append((loop.time() - start, usage(served.pid)))
                await asyncio.sleep(SAMPLE_EVERY)

        sampler = asyncio.create_task(sample())
        stack.push_async_callback(stopped, sampler)
        writing = asyncio.create_task(writer.write_for(SECONDS, rate=RATE))
        stack.push_async_callback(stopped, writing)
        await asyncio.wait([writing, reference_task], timeout=WARMUP)
        if reference_task.done():
            reference_task.result()  # its failure, if it failed
        warm = usage(served.pid)
        mid_stats = await cache_stats(vw, served.health_base)
        done = await writing
        end = usage(served.pid)
        samples.append((loop.time() - start, end))
        await stopped(sampler)

        # Every change kcp delivered must reach every client; then the clients report.
        made = [slice_event(w) for w in done if slice_event(w) is not None]
        # (Neither wait fails by itself: the verdict below says what is missing.)
        await reference.wait_for(len(made), within=STARVATION_BOUND)
        if reference_task.done():
            reference_task.result()
        await watchers.wait_complete(set(reference.changes), within=STARVATION_BOUND + 10)
        end_stats = await cache_stats(vw, served.health_base)
        metrics = await metric_samples(vw, f"{base}/metrics")
        reports = await watchers.finish(within=60)

    verdict = judge(
        reference=reference.changes, reports=reports, clients=WATCHES, bound=STARVATION_BOUND
    )
    growth = end.rss_kib / warm.rss_kib
    per_watch = (opened.rss_kib - before_watches.rss_kib) / WATCHES
    steady = (end.cpu_seconds - warm.cpu_seconds) / (samples[-1][0] - WARMUP)
    observe(
        f"soak: {WATCHES} TLS watches, {len(done)} writes in {SECONDS:.0f} s "
        f"({len(made)} slice changes → {len(made) * WATCHES} deliveries), "
        f"watches open in {ready['seconds']} s\n"
        f"RSS before the watches {before_watches.rss_mib:.1f} MiB, with them "
        f"{opened.rss_mib:.1f} MiB ({per_watch:.1f} KiB per watch); after the {WARMUP:.0f} s "
        f"warm-up {warm.rss_mib:.1f} MiB, at the end {end.rss_mib:.1f} MiB "
        f"(growth {100 * (growth - 1):+.1f} %); fds {warm.fds} → {end.fds}; "
        f"vwserver CPU {100 * steady:.0f} % of a core while writing\n"
        f"{verdict.lag_figures()}\n"
        f"kcp's open WATCH requests on {world.resource}: {kcp_watches}\n"
        f"curve:\n{figures(samples)}"
    )

    assert Counter(t for t, _, _ in reference.changes) == Counter(made), (
        "kcp's own watch did not deliver exactly the changes the writer made"
    )
    if verdict.problems:
        pytest.fail("\n".join(verdict.problems), pytrace=False)
    assert end.rss_kib <= RSS_GROWTH * warm.rss_kib, (
        f"RSS grew {100 * (growth - 1):.1f} % during the soak "
        f"({warm.rss_mib:.1f} → {end.rss_mib:.1f} MiB)\n{figures(samples)}"
    )
    assert abs(end.fds - warm.fds) <= FD_SLACK, (
        f"open fds {warm.fds} → {end.fds}\n{figures(samples)}"
    )
    # One upstream list+watch for the resource all along, shared by every watch.
    for stats in (mid_stats, end_stats):
        (resource,) = [s for s in stats if s["path"] == collection_path]
        assert resource["subscribers"] == WATCHES, resource
    restarts = [s for s in metrics if s.name == "vwserver_cache_reflector_restarts_total"]
    assert sum(s.value for s in restarts) == 0, restarts
