"""Reading a running vwserver's Prometheus metrics from its ``/metrics`` endpoint."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


async def sample(session: aiohttp.ClientSession, base: str, name: str, **labels: str) -> float:
    """The value of sample ``name`` (e.g. ``vwserver_upstream_requests_total``) whose labels
    include ``labels``, summed over the rest of its labels; 0 when there is none yet."""
    async with session.get(f"{base}/metrics") as resp:
        assert resp.status == 200, f"GET {base}/metrics: {resp.status}"
        text = await resp.text()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


async def per_worker(
    session: aiohttp.ClientSession, base: str, name: str, **labels: str
) -> dict[str, float]:
    """:func:`sample` per ``worker`` label, as the parent of several workers shows their
    metrics (``vwserver serve --workers``; ``base``: its health listener)."""
    async with session.get(f"{base}/metrics") as resp:
        assert resp.status == 200, f"GET {base}/metrics: {resp.status}"
        text = await resp.text()
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                worker = s.labels["worker"]
                sums[worker] = sums.get(worker, 0.0) + s.value
    return sums
