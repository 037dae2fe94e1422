"""vwserver's resident memory against the number of open watches, over TLS and plain HTTP.

Clients reach vwserver over TLS in production, and a TLS connection carries its own buffers
and cipher state, so the idle cost per watch is measured there (trustme certificates), with
plain HTTP beside it to show what TLS adds. The watches come from a separate process
(``watch_client.py``) and are idle once they have had their initial events; the RSS is read
from /proc after a pause, so what is counted is what an open watch keeps, not what its start
allocated transiently. The first watch starts the cache (one upstream LIST+WATCH); it is the
baseline, so the per-watch figure excludes the cache's own objects.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from urllib.parse import urlencode

from harness import (
    UNLIMITED_CONNECTIONS,
    WATCH_PARAMS,
    fake_upstream,
    make_serving_tls,
    record,
    rss_kib,
    vwserver,
)
from results import Ratio, Results, RssPoint

from clients import watch_client


async def bench_rss(results: Results, steps: tuple[int, ...], *, settle: float) -> None:
    """RSS with 1 and then *steps* watches open, read *settle* seconds after each opening."""
    for transport, key in (("TLS", "tls"), ("plain HTTP", "plain")):
        with tempfile.TemporaryDirectory() as tmp:
            tls = make_serving_tls(Path(tmp)) if transport == "TLS" else None
            async with (
                fake_upstream(100) as up,
                vwserver(up.origin, cache=True, tls=tls, extra_yaml=UNLIMITED_CONNECTIONS) as px,
                watch_client(
                    {"w": f"{px.list_url}?{urlencode(WATCH_PARAMS)}"},
                    ca=tls.ca_file if tls else None,
                ) as client,
            ):
                points: list[RssPoint] = []
                opened = 0
                for target in (1, *(n for n in steps if n > 1)):
                    opened = await client.open("w", target - opened)
                    await asyncio.sleep(settle)
                    points.append(
                        RssPoint(transport=transport, watches=opened, rss_kib=rss_kib(px.pid))
                    )
        results.rss += points
        first, last = points[0], points[-1]
        if last.watches == first.watches:
            continue
        per_watch = (last.rss_kib - first.rss_kib) / (last.watches - first.watches)
        record(
            results,
            f"rss.{key}.kib_per_watch",
            Ratio(
                label=f"idle RSS per watch, {transport}, {last.watches:,} watches",
                value=per_watch,
                unit="KiB",
                detail=f"{first.rss_kib / 1024:.1f} MiB with 1 → {last.rss_kib / 1024:.1f} MiB",
                target="≤ 64 KiB" if tls else "",
            ),
        )
