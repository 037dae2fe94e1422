"""GET latency of one object at a fixed concurrency: direct, through vwserver, through nginx.

The three targets serve the same object from the same fake upstream process; the load comes
from a separate process (``get_client.py``) with keep-alive connections, rounds rotating the
targets' order. vwserver sends a GET of one object to the upstream (GETs are not served from its
cache) after authenticating and authorizing the caller from warm caches. When nginx is not
there, the comparison says so in the output and the report instead of silently vanishing.
``workers`` (``run.py --workers 1,2``): one vwserver target per worker count, in the same run
(``vwserver`` is one process, ``vwserver-w2`` two on one port); each N > 1 is also compared
with one worker: its time per request at the same concurrency (1/throughput) relative to
``vwserver``'s, so < 1 means more throughput.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import AsyncIterator

from harness import API, fake_upstream, record, vwserver
from nginx import ensure_nginx, start_nginx
from results import GetRun, Ratio, Results, percentile

from clients import get_load

OBJECT = f"/clusters/cluster-0{API.removesuffix('/widgets')}/namespaces/ns-0/widgets/widget-000000"


@contextlib.asynccontextmanager
async def maybe_nginx(binary: str | None, upstream_origin: str) -> AsyncIterator[str | None]:
    if binary is None:
        yield None
        return
    async with start_nginx(binary, upstream_origin=upstream_origin) as base:
        yield base


async def bench_gets(
    results: Results,
    *,
    concurrency: tuple[int, ...],
    requests: int,
    rounds: int,
    install_nginx: bool,
    workers: tuple[int, ...] = (1,),
) -> None:
    binary, missing = ensure_nginx(install=install_nginx)
    if binary is None:
        results.skipped["GET through nginx"] = missing
        print(f"GET through nginx: NOT MEASURED: {missing}")
    async with (
        fake_upstream(1000) as up,
        contextlib.AsyncExitStack() as proxies,
        maybe_nginx(binary, up.origin) as nginx,
    ):
        targets = {"direct": up.vw + OBJECT}
        for n in workers:
            px = await proxies.enter_async_context(vwserver(up.origin, cache=True, workers=n))
            targets[target_name(n)] = px.slice_base + OBJECT
        if nginx:
            targets["nginx"] = nginx + up.vw.removeprefix(up.origin) + OBJECT
        latencies = await get_load(
            targets, concurrency=concurrency, requests=requests, rounds=rounds
        )
    for c in concurrency:
        runs = {name: summarize(name, c, latencies[name][c]) for name in targets}
        results.gets += runs.values()
        direct = runs["direct"]
        for name, run in runs.items():
            if name == "direct":
                continue
            for q, via, plain in (
                (50, run.p50_ms, direct.p50_ms),
                (99, run.p99_ms, direct.p99_ms),
            ):
                record(
                    results,
                    f"get.{name}.c{c}.p{q}",
                    Ratio(
                        label=f"GET at concurrency {c}, {name}, p{q}",
                        value=via / plain,
                        detail=f"{via:.2f} ms vs {plain:.2f} ms direct; "
                        f"{run.rps:,.0f} vs {direct.rps:,.0f} req/s",
                    ),
                )
        one = runs.get(target_name(1))
        for n in workers:
            run = runs[target_name(n)]
            if n == 1 or one is None:
                continue
            record(
                results,
                f"get.{target_name(n)}.c{c}.vs1",
                Ratio(
                    label=f"GET at concurrency {c}, {n} workers: time per request vs 1 worker",
                    value=one.rps / run.rps,
                    detail=f"{run.rps:,.0f} vs {one.rps:,.0f} req/s; p50 {run.p50_ms:.2f} vs "
                    f"{one.p50_ms:.2f} ms",
                ),
            )


def target_name(workers: int) -> str:
    return "vwserver" if workers == 1 else f"vwserver-w{workers}"


def summarize(target: str, concurrency: int, seconds: list[float]) -> GetRun:
    ordered = sorted(s * 1000 for s in seconds)
    return GetRun(
        target=target,
        concurrency=concurrency,
        requests=len(ordered),
        p50_ms=percentile(ordered, 50),
        p99_ms=percentile(ordered, 99),
        rps=concurrency / (statistics.fmean(ordered) / 1000),
    )
