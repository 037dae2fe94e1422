"""LIST time against object count through the fake upstream, and the watch stream's throughput.

The fake answers from pre-encoded bytes, so what vwserver adds shows undiluted. For each object
count a fresh upstream and two fresh vwservers (pass-through, cache) are started, so each one's
peak RSS belongs to that count. The slice selects half the objects; the direct call asks the
upstream for the same half with a labelSelector.
"""

from __future__ import annotations

from harness import (
    SELECTOR,
    WATCH_PARAMS,
    cache_reads,
    fake_upstream,
    list_once,
    ms,
    note_cache_reads,
    peak_rss_kib,
    record,
    session,
    timed_rounds,
    vwserver,
    watch_once,
)
from results import ListPoint, Ratio, Results


async def bench_lists(
    results: Results, counts: tuple[int, ...], *, repeat: int, page_size: int
) -> None:
    peaks: dict[int, int] = {}
    for objects in counts:
        async with (
            fake_upstream(objects) as up,
            vwserver(up.origin, page_size=page_size) as px,
            vwserver(up.origin, page_size=page_size, cache=True) as cx,
            session() as s,
        ):
            calls = {
                "direct": lambda: list_once(s, up.list_url, {"labelSelector": SELECTOR}),
                "pass-through": lambda: list_once(s, px.list_url, {}),
                "cache": lambda: list_once(s, cx.list_url, {}),
                "cache rv=0": lambda: list_once(s, cx.list_url, {"resourceVersion": "0"}),
            }
            await timed_rounds(calls, 1)  # warm up; the cache's first LIST and sync
            timings = await timed_rounds(calls, repeat)
            record_lists(
                results,
                "fake",
                objects,
                timings,
                (
                    ("pass-through", "passthrough", "direct", "≤ 1.10"),
                    ("cache", "cache", "direct", "≤ 1.50"),
                    ("cache rv=0", "cache_rv0", "direct", "≤ 1.50"),
                ),
            )
            note_cache_reads(results, f"fake, {objects:,} objects", await cache_reads(cx))
            peaks[objects] = peak_rss_kib(px.pid)
            print(
                f"{'':<44} peak RSS pass-through {peaks[objects] / 1024:.1f} MiB, "
                f"cache {peak_rss_kib(cx.pid) / 1024:.1f} MiB"
            )
    small, large = min(counts), max(counts)
    if large > small:
        record(
            results,
            f"rss.list_peak.{large}_vs_{small}",
            Ratio(
                label=f"pass-through peak RSS, LIST {large:,} vs {small:,}",
                value=peaks[large] / peaks[small],
                detail=f"{peaks[large] / 1024:.1f} MiB vs {peaks[small] / 1024:.1f} MiB",
                target="≤ 1.30",
            ),
        )


async def bench_watch(results: Results, *, events: int, repeat: int) -> None:
    """The initial events of a watch-list streamed through the pass-through proxy."""
    async with (
        fake_upstream(events * 2) as up,
        vwserver(up.origin) as px,
        session() as s,
    ):
        timings = await timed_rounds(
            {
                "direct": lambda: watch_once(
                    s, up.list_url, {**WATCH_PARAMS, "labelSelector": SELECTOR}
                ),
                "proxy": lambda: watch_once(s, px.list_url, WATCH_PARAMS),
            },
            repeat,
        )
    record_watch(results, "fake", timings)


Timings = dict[str, tuple[float, int]]


def record_lists(
    results: Results,
    upstream: str,
    objects: int,
    timings: Timings,
    compared: tuple[tuple[str, str, str, str], ...],
) -> None:
    """Keep every path's median LIST time as a plot point, and the ratio of each compared
    ``(path, key, direct path, target)``; all answers must have had the same size."""
    if len({count for _, count in timings.values()}) != 1:
        raise RuntimeError(f"{upstream} LIST answers differ in size: {timings}")
    for path, (seconds, count) in timings.items():
        results.lists.append(
            ListPoint(upstream=upstream, path=path, objects=objects, items=count, seconds=seconds)
        )
    items = timings["direct"][1]
    for path, key, against, target in compared:
        seconds, base = timings[path][0], timings[against][0]
        record(
            results,
            f"list.{upstream}.{key}.{objects}",
            Ratio(
                label=f"{upstream} LIST {objects:,} objects, {path}",
                value=seconds / base,
                detail=f"{ms(seconds)} vs {ms(base)} {against}, {items:,} items",
                target=target,
            ),
        )


def record_watch(results: Results, upstream: str, timings: Timings) -> None:
    """The watch-list ratio from the ``direct`` and ``proxy`` timings of its initial events."""
    (direct, n1), (proxied, n2) = timings["direct"], timings["proxy"]
    if n1 != n2:
        raise RuntimeError(f"{upstream} watch event counts differ: direct {n1}, proxy {n2}")
    record(
        results,
        f"watch.{upstream}.initial_events",
        Ratio(
            label=f"{upstream} WATCH {n2:,} initial events (time)",
            value=proxied / direct,
            detail=f"{n2 / proxied:,.0f} ev/s vs {n1 / direct:,.0f} ev/s direct",
            target="≤ 2.0 (≥ 50 % of direct throughput)",
        ),
    )
